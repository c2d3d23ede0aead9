"""The router's side of "billing is down": Settle calls that fail go to the llm_common
Outbox, survive a router restart, and are replayed once billing is back; the ledger ends
up exact (nothing lost, nothing counted twice)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
import redis.asyncio
from google.protobuf import timestamp_pb2
from prometheus_client import CollectorRegistry

from llm_billing.config import Settings
from llm_billing.metrics import BillingMetrics
from llm_billing.prices import PriceBook
from llm_billing.server import build_billing, build_spec
from llm_common.outbox import Delivery, Outbox, OutboxItem
from llm_common.resilience import Backoff
from llm_common.server import running
from llm_testing import free_port
from llmapi.billing.v1 import billing_service_pb2 as pb
from llmapi.billing.v1 import billing_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
# Reconnect quickly once billing is back (the defaults back off for up to two minutes).
CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 300),
]


def settle(rid: str, prompt: int, completion: int, **extra: object) -> pb.SettleRequest:
    return pb.SettleRequest(
        request_id=rid, prompt_tokens=prompt, completion_tokens=completion, **extra
    )


async def test_settles_spooled_while_billing_is_down_are_replayed_after_it_returns(
    settings: Settings,
    prices: PriceBook,
    tmp_path: Path,
    redis_client: redis.asyncio.Redis,
    cost_of: Callable[..., int],
) -> None:
    port = free_port()
    own = dataclasses.replace(settings, server=dataclasses.replace(settings.server, grpc_port=port))

    @contextlib.asynccontextmanager
    async def billing_up() -> AsyncIterator[None]:
        built = build_billing(own, prices, metrics=BillingMetrics(CollectorRegistry()))
        async with running(own.server, build_spec(built), host="127.0.0.1"):
            yield

    spool = tmp_path / "router" / "billing-outbox.db"
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=CHANNEL_OPTIONS)
    stub = pb_grpc.BillingServiceStub(channel)

    async def settle_or_spool(box: Outbox, request: pb.SettleRequest) -> None:
        """What the router does at the end of a request."""
        try:
            await stub.Settle(request, timeout=1)
        except grpc.aio.AioRpcError as err:
            if err.code() not in RETRYABLE:
                raise
            await box.put(f"settle:{request.request_id}", request.SerializeToString())

    expected = {"requests": 0, "cost": 0}

    def bill(model: str, prompt: int, completion: int) -> None:
        expected["requests"] += 1
        expected["cost"] += cost_of(model, prompt, completion)

    started = time.time()
    # 1. Billing is up: 20 requests admitted, the first 5 finish and settle directly.
    async with billing_up():
        for i in range(20):
            await stub.Reserve(
                pb.ReserveRequest(
                    request_id=f"r{i}",
                    tenant_id="acme",
                    key_id="k",
                    model="odd",
                    prompt_tokens=100 + i,
                    max_completion_tokens=50,
                ),
                timeout=5,
                wait_for_ready=True,
            )
        for i in range(5):
            await stub.Settle(settle(f"r{i}", 100 + i, 10 + i), timeout=5)
            bill("odd", 100 + i, 10 + i)

    # 2. Billing is down: the other 15 settles are spooled, plus 10 requests admitted without
    #    any reservation and a settle whose answer was lost (already delivered: a duplicate).
    box = await Outbox.open(spool)
    for i in range(5, 20):
        await settle_or_spool(box, settle(f"r{i}", 100 + i, 10 + i))
        bill("odd", 100 + i, 10 + i)
    admitted = timestamp_pb2.Timestamp(seconds=int(time.time()))
    for i in range(10):
        unreserved = settle(f"u{i}", 40, 4, tenant_id="acme", key_id="k", model="small",
                            admitted_at=admitted)  # fmt: skip
        await settle_or_spool(box, unreserved)
        bill("small", 40, 4)
    await box.put("settle:r4", settle("r4", 104, 14).SerializeToString())
    assert await box.pending() == 26
    await box.close()  # the router process goes away

    # 3. The router restarts and replays while billing is still down, then billing returns.
    box = await Outbox.open(spool, backoff=Backoff(base=0.05, cap=0.2, jitter=0.05))
    delivered, tries = [], []
    all_delivered = asyncio.Event()

    async def send(item: OutboxItem) -> Delivery:
        tries.append(item.key)
        try:
            reply = await stub.Settle(pb.SettleRequest.FromString(item.payload), timeout=1)
        except grpc.aio.AioRpcError as err:
            return Delivery.RETRY if err.code() in RETRYABLE else Delivery.REJECTED
        delivered.append(reply.request_id)
        if len(delivered) == 26:
            all_delivered.set()
        return Delivery.DELIVERED

    stop = asyncio.Event()
    replay = asyncio.create_task(box.run(send, stop, idle_poll_s=0.05))
    try:
        await asyncio.sleep(0.5)
        assert delivered == []
        assert tries  # replay was attempted, failed, and backed off
        assert await box.pending() == 26
        assert await box.dead_letters() == []
        async with billing_up():
            async with asyncio.timeout(30):
                await all_delivered.wait()
            stop.set()
            await replay
            assert await box.pending() == 0
            await check_ledger(stub, started, expected)
    finally:
        stop.set()
        await box.close()
        await channel.close()


async def check_ledger(stub: pb_grpc.BillingServiceAsyncStub, started: float,
                       expected: dict[str, int]) -> None:  # fmt: skip
    window = {
        "start_time": timestamp_pb2.Timestamp(seconds=int(started) - 7200),
        "end_time": timestamp_pb2.Timestamp(seconds=int(time.time()) + 7200),
    }
    usage = (await stub.GetUsage(pb.GetUsageRequest(tenant_id="acme", **window))).total
    assert (usage.requests, usage.cost_micros) == (expected["requests"], expected["cost"])
    lines = [m.line async for m in stub.ExportUsage(pb.ExportUsageRequest(**window))]
    assert len(lines) - 1 == expected["requests"]  # r4 once, despite its replayed duplicate
