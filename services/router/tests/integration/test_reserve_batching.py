"""Admissions' Reserve calls coalesced into ReserveBatch calls, against the real billing
service on port 0 and the real Redis: a lone Reserve stays unary, concurrent ones share
calls, a refused item alone gets its QuotaExceeded (details kept), an older billing without
ReserveBatch gets unary calls, and an unreachable billing fails every caller."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest

from llm_auth.testing import delete_prefix, unique_prefix
from llm_common.errors import QuotaExceeded
from llm_router.clients.batching import BatchShape
from llm_router.clients.billing import BillingClient, ReserveResult
from llm_router.errors import DependencyUnavailable
from llm_testing import RunningServer, free_port
from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.billing.v1 import billing_service_pb2_grpc as billing_grpc

from .conftest import reserve_request, running_billing

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
MODEL = "demo-llama"
TENANT = "acme"  # the key prefix keeps tests apart


class CountingBilling(BillingClient):
    """The real client with reserve batching on, recording the size of each batch it sends
    and how many ReserveBatch calls it made."""

    def __init__(self, channel: grpc.aio.Channel, retry_s: float = 60.0) -> None:
        shape = BatchShape(max_items=64, wait_s=0.002, max_in_flight=1)
        super().__init__(
            channel, timeout_s=2.0, breaker=None, reserve_batch=shape, reserve_batch_retry_s=retry_s
        )
        self.batches: list[int] = []
        self.batch_calls = 0

    async def reserve_batch(
        self, requests: Sequence[billing_pb.ReserveRequest], timeout_s: float
    ) -> list[ReserveResult]:
        self.batches.append(len(requests))
        return await super().reserve_batch(requests, timeout_s)

    async def _reserve_batch_call(
        self, request: billing_pb.ReserveBatchRequest, timeout_s: float
    ) -> billing_pb.ReserveBatchResponse | None:
        self.batch_calls += 1
        return await super()._reserve_batch_call(request, timeout_s)


@pytest.fixture
async def prefix(redis_url: str) -> AsyncIterator[str]:
    value = unique_prefix()
    yield value
    await delete_prefix(redis_url, value)


def request(rid: str) -> billing_pb.ReserveRequest:
    return reserve_request(rid, TENANT, MODEL)


@contextlib.asynccontextmanager
async def billing_and_client(
    redis_url: str, prefix: str, workdir: Path, *, older: bool = False, retry_s: float = 60.0
) -> AsyncIterator[tuple[RunningServer, CountingBilling]]:
    """A billing service (`older`: without ReserveBatch) and a batching client of it."""
    async with (
        running_billing(redis_url, prefix, workdir, older=older) as billing,
        grpc.aio.insecure_channel(billing.target) as channel,
    ):
        yield billing, CountingBilling(channel, retry_s)


async def budget(channel: grpc.aio.Channel, limit: int = 0) -> billing_pb.Budget:
    """The tenant's daily budget; set to `limit` first when given."""
    stub = billing_grpc.BillingServiceStub(channel)
    if limit:
        day = billing_pb.Budget(
            tenant_id=TENANT, period=billing_pb.BUDGET_PERIOD_DAY, hard_limit_micros=limit
        )
        await stub.SetBudget(billing_pb.SetBudgetRequest(budget=day))
    return (await stub.GetBudget(billing_pb.GetBudgetRequest(tenant_id=TENANT))).budget


async def outcomes(client: BillingClient, rids: list[str]) -> list[ReserveResult]:
    async def one(rid: str) -> ReserveResult:
        try:
            return await client.reserve(request(rid))
        except Exception as err:  # each caller's own outcome
            return err

    return list(await asyncio.gather(*(one(rid) for rid in rids)))


async def test_a_lone_reserve_is_unary_and_concurrent_ones_share_calls(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    async with billing_and_client(redis_url, prefix, tmp_path) as (billing, client):
        await budget(billing.channel, 10**12)
        lone = await client.reserve(request("lone"))
        assert client.batches == [1]  # nothing was in flight: sent at once, alone

        replies = await outcomes(client, [f"r{i}" for i in range(60)])

        assert all(isinstance(r, billing_pb.ReserveResponse) for r in replies), replies
        assert [r.request_id for r in replies] == [f"r{i}" for i in range(60)]  # type: ignore[union-attr]
        assert sum(client.batches) == 61
        assert len(client.batches) < 30
        assert max(client.batches) > 1
        held = (await budget(billing.channel)).reserved_micros
        assert held == 61 * lone.reserved_micros


async def test_a_refused_item_alone_gets_quota_exceeded(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    async with billing_and_client(redis_url, prefix, tmp_path) as (billing, client):
        each = (await client.reserve(request("probe"))).reserved_micros
        await budget(billing.channel, 11 * each)  # the probe and 10 more fit

        replies = await outcomes(client, [f"r{i}" for i in range(16)])

        refused = [r for r in replies if isinstance(r, QuotaExceeded)]
        assert len(refused) == 6
        assert len(replies) - len(refused) == 10
        assert all(r.violations and r.retry_after_s for r in refused)
        assert max(client.batches) > 1  # the refusals came from shared calls
        assert (await budget(billing.channel)).reserved_micros == 11 * each


async def test_an_older_billing_gets_unary_reserves_then_is_asked_again(
    redis_url: str, prefix: str, tmp_path: Path
) -> None:
    older = billing_and_client(redis_url, prefix, tmp_path, older=True, retry_s=0.5)
    async with older as (billing, client):
        first = await outcomes(client, [f"a{i}" for i in range(20)])
        second = await outcomes(client, [f"b{i}" for i in range(20)])
        assert client.batch_calls == 1  # answered UNIMPLEMENTED once, then unary calls only
        await asyncio.sleep(0.6)
        third = await outcomes(client, [f"c{i}" for i in range(20)])
        assert client.batch_calls == 2  # asked again once the retry interval had passed

        replies = first + second + third
        assert all(isinstance(r, billing_pb.ReserveResponse) for r in replies)
        assert not any(r.duplicate for r in replies)  # type: ignore[union-attr]
        assert max(client.batches) > 1  # batches were formed and then sent as unary calls
        held = (await budget(billing.channel, 10**12)).reserved_micros
        assert held == 60 * first[0].reserved_micros  # type: ignore[union-attr]


async def test_an_unreachable_billing_fails_every_caller() -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{free_port()}") as channel:
        client = CountingBilling(channel)
        replies = await outcomes(client, [f"r{i}" for i in range(8)])
    assert all(isinstance(r, DependencyUnavailable) for r in replies), replies
    assert max(client.batches) > 1
