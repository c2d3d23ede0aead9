"""Threat 9 (docs/security.md), billing's part: ForgetTenant deletes one tenant's per-request
records from the Redis ledger and unlinks its usage rows from their requests in the SQL store
(SQLite and a real PostgreSQL), while usage reports and invoices add up to the same totals;
another tenant keeps everything; refused while requests are in flight."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis.asyncio
import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from llm_billing.config import Settings, UsageStoreSettings
from llm_billing.erasure import ERASED_PREFIX
from llm_billing.metrics import BillingMetrics
from llm_billing.prices import PriceBook
from llm_billing.server import build_billing, build_spec
from llm_billing.service import timestamp
from llm_billing.usagedb import usage_records
from llm_common.errors import parse_error
from llm_testing import running_server
from llmapi.billing.v1 import billing_service_pb2 as pb
from llmapi.billing.v1 import billing_service_pb2_grpc as pb_grpc

from .pg import scratch_database

pytestmark = [pytest.mark.integration, pytest.mark.security]
HOUR_MS = 3_600_000
NOV_10 = round(datetime(2026, 11, 10, tzinfo=UTC).timestamp() * 1000)
DEC_01 = round(datetime(2026, 12, 1, tzinfo=UTC).timestamp() * 1000)


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/usage.db"
        return
    with scratch_database() as url:
        yield url


async def settle_some(stub: Any, tenant: str, n: int) -> None:
    for i in range(n):
        await stub.Settle(
            pb.SettleRequest(
                request_id=f"{tenant}-{i}", tenant_id=tenant, key_id=f"k{i % 2}", model="odd",
                prompt_tokens=1000 + i, completion_tokens=7 * i, cached_tokens=i,
                admitted_at=timestamp(NOV_10 - i * HOUR_MS - 17 * 60_000),
            )
        )  # fmt: skip


async def usage_total(stub: Any, tenant: str) -> Any:
    request = pb.GetUsageRequest(
        tenant_id=tenant,
        start_time=timestamp(NOV_10 - 40 * HOUR_MS),
        end_time=timestamp(DEC_01),
        granularity=pb.GRANULARITY_TOTAL,
    )
    return (await stub.GetUsage(request)).total


def sql_rows(engine: sa.Engine, tenant: str) -> list[Any]:
    t = usage_records.c
    query = sa.select(t.request_id, t.started_at, t.finish_reason).where(t.tenant_id == tenant)
    with engine.connect() as conn:
        return list(conn.execute(query).all())


async def test_forget_keeps_totals_and_drops_request_records(
    settings: Settings,
    prices: PriceBook,
    database_url: str,
    redis_client: redis.asyncio.Redis,
) -> None:
    clock = Clock(NOV_10)
    own = dataclasses.replace(settings, usage_store=UsageStoreSettings(database_url=database_url))
    built = build_billing(own, prices, metrics=BillingMetrics(CollectorRegistry()), clock=clock)
    assert built.usage_store is not None
    assert await built.usage_store.migrate()
    engine = built.usage_store.store.engine
    async with running_server(build_spec(built), settings=own.server) as running:
        stub = pb_grpc.BillingServiceStub(running.channel)
        await settle_some(stub, "acme", 12)
        await settle_some(stub, "globex", 5)
        await stub.Reserve(
            pb.ReserveRequest(
                request_id="acme-open", tenant_id="acme", model="odd",
                prompt_tokens=10, max_completion_tokens=10,
            )
        )  # fmt: skip
        before = {t: await usage_total(stub, t) for t in ("acme", "globex")}

        forget = pb.ForgetTenantRequest(tenant_id="acme")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ForgetTenant(forget)  # a request is still open
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        await stub.Release(pb.ReleaseRequest(request_id="acme-open", tenant_id="acme"))
        await built.usage_store.outbox.drain()
        globex_rows = sql_rows(engine, "globex")
        assert len(globex_rows) == 5
        assert any(r.started_at.minute for r in sql_rows(engine, "acme"))

        reply = await stub.ForgetTenant(forget)
        assert reply.ledger_records_deleted == 13
        assert reply.usage_rows_deleted == 12  # a released request leaves no row

        ledger_keys = [k async for k in redis_client.scan_iter(match="*acme*")]
        assert not [k for k in ledger_keys if ":rec:" in str(k) or "rid:acme" in str(k)]
        assert not [k async for k in redis_client.scan_iter(match="*rid:acme-*")]
        rows = sql_rows(engine, "acme")
        assert len(rows) == 12
        assert all(r.request_id.startswith(ERASED_PREFIX) for r in rows)
        assert all(r.started_at.minute == 0 and r.started_at.second == 0 for r in rows)
        assert sql_rows(engine, "globex") == globex_rows
        after = {t: await usage_total(stub, t) for t in ("acme", "globex")}
        assert after == before

        clock.ms = DEC_01 + 3 * HOUR_MS  # November is over: its invoice sums the kept rows
        invoice = (
            await stub.CreateInvoice(pb.CreateInvoiceRequest(tenant_id="acme", month="2026-11"))
        ).invoice
        assert invoice.total_micros == before["acme"].cost_micros
        assert invoice.requests == 12  # the released request charges nothing
    await built.aclose()


async def test_forget_validates(settings: Settings, prices: PriceBook) -> None:
    built = build_billing(settings, prices, metrics=BillingMetrics(CollectorRegistry()))
    async with running_server(build_spec(built), settings=settings.server) as running:
        stub = pb_grpc.BillingServiceStub(running.channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ForgetTenant(pb.ForgetTenantRequest(tenant_id=""))
        error = parse_error(refused.value)
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT
        assert {v.field for v in error.field_violations} == {"tenant_id"}
        reply = await stub.ForgetTenant(pb.ForgetTenantRequest(tenant_id="nobody"))
        assert (reply.ledger_records_deleted, reply.usage_rows_deleted) == (0, 0)
    await built.aclose()
