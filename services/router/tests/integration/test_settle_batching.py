"""Settlements coalesced into SettleBatch calls, against the real billing service on port 0
and the real Redis: fewer calls, each settle recorded once, a bad item alone refused, and the
outbox spooling while billing is down and replaying in batches once it is back."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest
from google.protobuf import timestamp_pb2
from prometheus_client import CollectorRegistry

from llm_auth.testing import delete_prefix, unique_prefix
from llm_common.outbox import Outbox
from llm_router.background import Background
from llm_router.clients.billing import BillingCall, BillingClient, ItemResult, SettleBatcher
from llm_router.observability import RouterMetrics
from llm_router.settlement.outbox import BillingSpool
from llm_router.settlement.settle import Admission, Outcome, Settler
from llm_testing import free_port
from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.billing.v1 import billing_service_pb2_grpc as billing_grpc
from llmapi.common.v1 import common_pb2

from .conftest import reserve_request, running_billing, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
MODEL = "demo-llama"
STOP = common_pb2.FINISH_REASON_STOP


class CountingBilling(BillingClient):
    """The real client, counting the SettleBatch calls it makes."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        super().__init__(channel, timeout_s=2.0, breaker=None)
        self.batch_calls: list[int] = []

    async def settle_batch(
        self, calls: Sequence[BillingCall], timeout_s: float
    ) -> list[ItemResult]:
        self.batch_calls.append(len(calls))
        return await super().settle_batch(calls, timeout_s)


class Parts:
    """A Settler with a batcher over the real billing client, and its spool."""

    def __init__(self, target: str, outbox: Outbox, *, wait_s: float = 0.002) -> None:
        self.channel = grpc.aio.insecure_channel(target)
        self.billing = CountingBilling(self.channel)
        self.registry = CollectorRegistry()
        metrics = RouterMetrics(self.registry)
        self.spool = BillingSpool(
            outbox, self.billing, timeout_s=2.0, metrics=metrics, batch_max=16, idle_poll_s=0.1
        )
        self.batcher = SettleBatcher(
            self.billing.settle_batch, max_items=64, wait_s=wait_s, timeout_s=2.0
        )
        self.background = Background()
        self.settler = Settler(
            self.billing,
            None,
            self.spool,
            timeout_s=2.0,
            metrics=metrics,
            background=self.background,
            batcher=self.batcher,
        )

    def count(self, outcome: str) -> float:
        value = self.registry.get_sample_value("llm_router_settlements_total", {"outcome": outcome})
        return value or 0.0


@pytest.fixture
async def outbox(tmp_path: Path) -> AsyncIterator[Outbox]:
    box = await Outbox.open(tmp_path / "outbox.sqlite3", synchronous="NORMAL")
    yield box
    await box.close()


@pytest.fixture
async def prefix(redis_url: str) -> AsyncIterator[str]:
    value = unique_prefix()
    yield value
    await delete_prefix(redis_url, value)


def admission(rid: str, tenant: str, *, reserved: bool = True) -> Admission:
    return Admission(
        billing_id=rid,
        tenant_id=tenant,
        key_id="k1",
        billing_key_id="k1",
        model=MODEL,
        prompt_tokens=100,
        max_tokens=50,
        quota_tokens=0,
        billing_reserved=reserved,
        admitted_at_s=time.time(),
    )


def outcome(completion: int) -> Outcome:
    return Outcome(100, completion, 0, STOP, produced=True)


async def reserve(billing: BillingClient, rid: str, tenant: str) -> None:
    await billing.reserve(reserve_request(rid, tenant, MODEL))


async def usage(channel: grpc.aio.Channel, tenant: str) -> billing_pb.UsageBucket:
    now = int(time.time())
    request = billing_pb.GetUsageRequest(
        tenant_id=tenant,
        start_time=timestamp_pb2.Timestamp(seconds=now - 7200),
        end_time=timestamp_pb2.Timestamp(seconds=now + 7200),
    )
    return (await billing_grpc.BillingServiceStub(channel).GetUsage(request)).total


async def test_concurrent_settles_share_calls_and_count_once(
    redis_url: str, prefix: str, outbox: Outbox, tmp_path: Path
) -> None:
    tenant = "acme"  # the key prefix keeps tests apart
    async with running_billing(redis_url, prefix, tmp_path) as billing:
        parts = Parts(billing.target, outbox)
        rids = [f"{tenant}-r{i}" for i in range(150)]
        await asyncio.gather(*(reserve(parts.billing, rid, tenant) for rid in rids))
        # 140 settles, 10 releases (nothing produced), all at once, each settled twice.
        settles = [
            parts.settler.settle(admission(rid, tenant), outcome(i % 40))
            for i, rid in enumerate(rids[:140])
        ]
        releases = [
            parts.settler.settle(admission(rid, tenant), Outcome(0, 0, 0, STOP, produced=False))
            for rid in rids[140:]
        ]
        await asyncio.gather(*settles, *releases)
        await asyncio.gather(
            *(parts.settler.settle(admission(r, tenant), outcome(1)) for r in rids[:10])
        )

        assert sum(parts.billing.batch_calls) == 160
        assert len(parts.billing.batch_calls) <= 6  # 64 + 64 + 22 at most split by timing, + 10
        assert max(parts.billing.batch_calls) == 64
        assert (parts.count("settled"), parts.count("released")) == (150, 10)
        total = await usage(billing.channel, tenant)
        assert (total.requests, total.prompt_tokens) == (140, 140 * 100)
        assert total.completion_tokens == sum(i % 40 for i in range(140))  # not the repeats
        await parts.channel.close()


async def test_a_bad_item_is_refused_alone(
    redis_url: str, prefix: str, outbox: Outbox, tmp_path: Path
) -> None:
    tenant = "acme"  # the key prefix keeps tests apart
    async with running_billing(redis_url, prefix, tmp_path) as billing:
        parts = Parts(billing.target, outbox)
        good = [f"{tenant}-g{i}" for i in range(5)]
        for rid in good:
            await reserve(parts.billing, rid, tenant)
        bad = [
            admission("bad id!", tenant),  # INVALID_ARGUMENT
            admission(f"{tenant}-x", "bad tenant!"),  # INVALID_ARGUMENT
            # No reservation and no price for the model: NOT_FOUND.
            dataclasses.replace(admission(f"{tenant}-y", tenant), model="no-such-model"),
        ]
        await asyncio.gather(
            *(parts.settler.settle(a, outcome(7)) for a in bad),
            *(parts.settler.settle(admission(rid, tenant), outcome(7)) for rid in good),
        )
        assert parts.billing.batch_calls == [8]
        assert (parts.count("settled"), parts.count("failed")) == (5, 3)
        assert parts.count("spooled") == 0
        assert await outbox.pending() == 0
        assert (await usage(billing.channel, tenant)).requests == 5
        await parts.channel.close()


async def test_billing_down_spools_then_replays_in_batches(
    redis_url: str, prefix: str, outbox: Outbox, tmp_path: Path
) -> None:
    tenant = "acme"  # the key prefix keeps tests apart
    port = free_port()  # billing comes up here later
    parts = Parts(f"127.0.0.1:{port}", outbox)
    admissions = [admission(f"{tenant}-s{i}", tenant, reserved=False) for i in range(40)]
    await asyncio.gather(*(parts.settler.settle(a, outcome(3)) for a in admissions))
    assert parts.count("spooled") == 40
    assert await outbox.pending() == 40
    batches_while_down = len(parts.billing.batch_calls)

    async with running_billing(redis_url, prefix, tmp_path, port=port) as billing:
        parts.spool.start()
        try:

            async def drained() -> bool:
                return await outbox.pending() == 0

            await wait_for(drained, timeout_s=30.0)
        finally:
            await parts.spool.stop()
        replayed = parts.billing.batch_calls[batches_while_down:]
        assert sum(replayed) >= 40
        assert max(replayed) == 16  # batch_max of the spool, not one call per settle
        assert parts.count("replayed") == 40
        total = await usage(billing.channel, tenant)
        assert (total.requests, total.completion_tokens) == (40, 40 * 3)
    await parts.channel.close()


async def test_flush_sends_the_queue_without_waiting_for_the_timer(
    redis_url: str, prefix: str, outbox: Outbox, tmp_path: Path
) -> None:
    tenant = "acme"  # the key prefix keeps tests apart
    async with running_billing(redis_url, prefix, tmp_path) as billing:
        parts = Parts(billing.target, outbox, wait_s=30.0)
        for i in range(3):
            await reserve(parts.billing, f"{tenant}-f{i}", tenant)
            parts.settler.submit(admission(f"{tenant}-f{i}", tenant), outcome(2))
        await asyncio.sleep(0.05)
        assert len(parts.batcher) == 3  # still waiting for the timer
        started = time.monotonic()
        await parts.settler.flush()
        await parts.background.drain(5.0)
        assert time.monotonic() - started < 5.0
        assert len(parts.background) == 0
        assert parts.billing.batch_calls == [3]
        assert (await usage(billing.channel, tenant)).requests == 3
        await parts.channel.close()
