"""The SQL usage store fed by the Redis outbox, on SQLite and PostgreSQL: one row per request
with exactly the ledger's usage (corrections and refunds included), replays that change
nothing, reconciliation, invoices, and GetUsage / ExportUsage from the store."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
import redis.asyncio
import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from llm_billing.cli import run
from llm_billing.config import Settings, UsageStoreSettings
from llm_billing.invoicing import create_invoice
from llm_billing.ledger_values import Admission, ReserveInput, SettleInput, Usage
from llm_billing.metrics import BillingMetrics
from llm_billing.prices import PriceBook
from llm_billing.server import Billing, build_billing, build_spec
from llm_billing.service import timestamp
from llm_billing.timeutil import HOUR_MS
from llm_billing.usage import Granularity, UsageQuery
from llm_billing.usagedb import usage_records
from llm_testing import running_server
from llmapi.billing.v1 import billing_service_pb2 as pb
from llmapi.billing.v1 import billing_service_pb2_grpc as pb_grpc

from .pg import scratch_database

pytestmark = pytest.mark.integration
NOV_10 = round(datetime(2026, 11, 10, tzinfo=UTC).timestamp() * 1000)
DEC_01 = round(datetime(2026, 12, 1, tzinfo=UTC).timestamp() * 1000)
MODELS = ("small", "odd", "big")
KEYS = ("", "k1", "k2")
TENANTS = ("acme", "globex", "initech")


class Clock:
    def __init__(self, ms: int) -> None:
        self.ms = ms

    def __call__(self) -> int:
        return self.ms


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/usage.db"
        return
    with scratch_database() as url:
        yield url


@pytest.fixture
async def stored(
    settings: object,
    prices: PriceBook,
    database_url: str,
    redis_client: redis.asyncio.Redis,
) -> AsyncIterator[tuple[Billing, Clock]]:
    clock = Clock(NOV_10)
    own = dataclasses.replace(
        settings,  # type: ignore[type-var]
        usage_store=UsageStoreSettings(database_url=database_url, batch_size=64),
    )
    built = build_billing(own, prices, metrics=BillingMetrics(CollectorRegistry()), clock=clock)
    assert built.usage_store is not None
    assert await built.usage_store.migrate()
    try:
        yield built, clock
    finally:
        await built.aclose()


Expected = dict[str, tuple[str, str, str, str, int, int, int, int, str]]


async def run_mix(billing: Billing, clock: Clock, cost_of: Callable[..., int]) -> Expected:
    """Mixed traffic; returns each request's expected row:
    (tenant, key, model, status, prompt, cached, completion, cost, ...)."""
    rng = random.Random(7)
    ledger, expected = billing.ledger, {}
    expiring: list[tuple[ReserveInput, str]] = []
    for i in range(240):
        tenant, key, model = rng.choice(TENANTS), rng.choice(KEYS), rng.choice(MODELS)
        rid = f"req-{i}"
        prompt, completion = rng.randint(1, 5000), rng.randint(0, 2000)
        cached = rng.randint(0, prompt)
        usage = Usage(prompt, completion, cached, 1)
        kind = rng.random()
        clock.ms += rng.randint(1, 30_000)
        if kind < 0.15:  # admitted while billing was down: no reservation
            admission = Admission(key, model, clock.ms - 1000)
            s = await ledger.settle(SettleInput(rid, tenant, usage, admission))
            assert s.unreserved
        else:
            r = ReserveInput(rid, tenant, key, model, prompt, completion + 100)
            await ledger.reserve(r)
            if kind < 0.25:
                await ledger.release(rid, tenant)  # nothing generated: no row
                continue
            if kind < 0.40:
                expiring.append((r, rng.choice(["keep", "settle", "release"])))
                continue
            s = await ledger.settle(SettleInput(rid, tenant, usage))
            if kind < 0.5:  # a duplicate settle changes nothing
                assert (await ledger.settle(SettleInput(rid, tenant, usage))).duplicate
        expected[rid] = (
            tenant,
            key,
            model,
            "settled",
            prompt,
            cached,
            completion,
            s.charged_micros,
            "",
        )
    clock.ms += 700_000  # past the reservation TTL
    assert await ledger.sweep() == len(expiring)
    for r, then in expiring:
        worst = cost_of(r.model, r.prompt_tokens, r.max_completion_tokens)
        row = (
            r.tenant_id,
            r.key_id,
            r.model,
            "expired",
            r.prompt_tokens,
            0,
            r.max_completion_tokens,
            worst,
            "",
        )
        if then == "settle":
            s = await ledger.settle(SettleInput(r.request_id, r.tenant_id, Usage(10, 5, 0, 1)))
            assert s.corrected
            row = (r.tenant_id, r.key_id, r.model, "corrected", 10, 0, 5, s.charged_micros, "")
        elif then == "release":
            assert await ledger.release(r.request_id, r.tenant_id)
            row = (r.tenant_id, r.key_id, r.model, "released", 0, 0, 0, 0, "")
        expected[r.request_id] = row
    return expected


def rows(billing: Billing) -> dict[str, tuple[object, ...]]:
    assert billing.usage_store is not None
    t = usage_records.c
    query = sa.select(
        t.request_id, t.tenant_id, t.key_id, t.model, t.status, t.prompt_tokens,
        t.cached_tokens, t.completion_tokens, t.cost_micros,
    )  # fmt: skip
    with billing.usage_store.store.engine.connect() as conn:
        return {r[0]: (*tuple(r[1:]), "") for r in conn.execute(query).all()}


async def test_one_row_per_request_exactly_the_ledger(
    stored: tuple[Billing, Clock], cost_of: Callable[..., int]
) -> None:
    billing, clock = stored
    parts = billing.usage_store
    assert parts is not None
    expected = await run_mix(billing, clock, cost_of)
    assert (await parts.outbox.backlog()).entries > 0  # nothing written on the request path
    assert await parts.outbox.drain() > 0
    assert (await parts.outbox.backlog()).entries == 0
    assert rows(billing) == {rid: tuple(v) for rid, v in expected.items()}
    # Replays change nothing: the same rows again, and older outcomes after newer ones.
    replay = await asyncio_rows(billing)
    parts.store.write(replay)
    parts.store.write([dataclasses.replace(r, status="expired", cost_micros=1) for r in replay])
    assert rows(billing) == {rid: tuple(v) for rid, v in expected.items()}
    hours = (NOV_10 // HOUR_MS, clock.ms // HOUR_MS + 1)
    report = await parts.reconciler.run(*hours)
    assert report.clean, report.differences
    assert report.cells > 10
    # A row the ledger does not know is reported.
    extra = dataclasses.replace(replay[0], request_id="ghost", cost_micros=5)
    parts.store.write([extra])
    report = await parts.reconciler.run(*hours)
    assert len(report.differences) == 1
    assert report.differences[0].cell.tenant_id == extra.tenant_id


async def asyncio_rows(billing: Billing) -> list:  # type: ignore[type-arg]
    """The store's rows as UsageRows (to replay them)."""
    from llm_billing.usagedb import UsageRow, datetime_ms

    assert billing.usage_store is not None
    with billing.usage_store.store.engine.connect() as conn:
        found = conn.execute(sa.select(usage_records)).mappings().all()
    return [
        UsageRow(
            r["request_id"],
            r["tenant_id"],
            r["key_id"],
            r["model"],
            r["prompt_tokens"],
            r["cached_tokens"],
            r["completion_tokens"],
            r["cost_micros"],
            r["currency"],
            r["price_version"],
            datetime_ms(r["started_at"]),
            datetime_ms(r["settled_at"]),
            r["started_hour"],
            r["status"],
            r["finish_reason"],
        )
        for r in found
    ]


async def test_invoice_reports_and_export_from_the_store(
    stored: tuple[Billing, Clock], cost_of: Callable[..., int]
) -> None:
    billing, clock = stored
    parts = billing.usage_store
    assert parts is not None
    expected = await run_mix(billing, clock, cost_of)
    with pytest.raises(Exception, match="once it is over"):
        await parts.invoicing.create("acme", "2026-11")
    clock.ms = DEC_01 + 3 * HOUR_MS
    for tenant in TENANTS:
        invoice, created = await parts.invoicing.create(tenant, "2026-11")  # drains first
        assert created
        mine = [v for v in expected.values() if v[0] == tenant and v[3] != "released"]
        assert invoice.total_micros == sum(v[7] for v in mine)
        assert invoice.requests == len(mine)
        assert invoice.total_micros == sum(line.cost_micros for line in invoice.lines)
        assert invoice.prompt_tokens == sum(v[4] for v in mine)
        again, created = await parts.invoicing.create(tenant, "2026-11")
        assert not created
        assert again == invoice
        assert await parts.invoicing.get(tenant, "2026-11") == invoice
        # Issued invoices never change, even if rows arrive later.
        late = create_invoice(parts.store, tenant, "2026-11", "USD", clock.ms)
        assert late == (invoice, False)
    # Ranges older than the record retention are read from the store: same answers.
    clock.ms = NOV_10 + 40 * 24 * HOUR_MS
    for granularity in Granularity:
        for key, model in (("", ""), ("k1", ""), ("", "odd"), ("k2", "big")):
            q = UsageQuery("acme", key, model, NOV_10 - HOUR_MS, DEC_01, granularity)
            assert parts.reads_store(q.start_ms)
            assert await parts.usage(q) == await billing.usage.usage(q)
    from_store = [line async for line in parts.export(None, NOV_10 - HOUR_MS, DEC_01)]
    from_redis = [line async for line in billing.invoices.lines(None, NOV_10 - HOUR_MS, DEC_01)]
    assert from_store == from_redis
    assert len(from_store) == 1 + sum(1 for v in expected.values() if v[3] != "released")


async def test_invoice_rpcs_and_command(
    settings: Settings,
    prices: PriceBook,
    database_url: str,
    redis_client: redis.asyncio.Redis,
    capsys: pytest.CaptureFixture[str],
) -> None:
    clock = Clock(NOV_10)
    own = dataclasses.replace(settings, usage_store=UsageStoreSettings(database_url=database_url))
    built = build_billing(own, prices, metrics=BillingMetrics(CollectorRegistry()), clock=clock)
    async with running_server(build_spec(built), settings=own.server) as running:
        stub = pb_grpc.BillingServiceStub(running.channel)
        total = 0
        for i in range(30):
            settle = pb.SettleRequest(
                request_id=f"inv-{i}", tenant_id="acme", key_id=f"k{i % 2}", model="odd",
                prompt_tokens=1000 + i, completion_tokens=77 * i, cached_tokens=i,
                admitted_at=timestamp(NOV_10 - i * 3_600_000),
            )  # fmt: skip
            total += (await stub.Settle(settle)).charged_micros
        ref = pb.CreateInvoiceRequest(tenant_id="acme", month="2026-11")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.CreateInvoice(ref)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION  # November is not over
        clock.ms = DEC_01 + 3 * HOUR_MS
        first = await stub.CreateInvoice(ref)
        assert first.created
        assert first.invoice.total_micros == total
        assert first.invoice.requests == 30
        assert {(line.key_id, line.model) for line in first.invoice.lines} == {
            ("k0", "odd"),
            ("k1", "odd"),
        }
        assert sum(line.cost_micros for line in first.invoice.lines) == total
        again = await stub.CreateInvoice(ref)
        assert not again.created
        assert again.invoice == first.invoice
        got = await stub.GetInvoice(pb.GetInvoiceRequest(tenant_id="acme", month="2026-11"))
        assert got.invoice == first.invoice
        # Older than the record retention: GetUsage and ExportUsage answer from the store.
        clock.ms = NOV_10 + 40 * 24 * HOUR_MS
        since, until = timestamp(NOV_10 - 40 * HOUR_MS), timestamp(DEC_01)
        usage = await stub.GetUsage(
            pb.GetUsageRequest(tenant_id="acme", start_time=since, end_time=until)
        )
        assert (usage.total.requests, usage.total.cost_micros) == (30, total)
        export = pb.ExportUsageRequest(tenant_id="acme", start_time=since, end_time=until)
        lines = [reply.line async for reply in stub.ExportUsage(export)]
        assert len(lines) == 31
        assert sum(int(line.split(",")[10]) for line in lines[1:]) == total
        bad = (
            ("2026-10", grpc.StatusCode.NOT_FOUND),
            ("2026-13", grpc.StatusCode.INVALID_ARGUMENT),
        )
        for month, code in bad:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.GetInvoice(pb.GetInvoiceRequest(tenant_id="acme", month=month))
            assert err.value.code() == code
    environ = {
        "REDIS_URL": own.redis.url,
        "BILLING_KEY_PREFIX": own.ledger.key_prefix,
        "PRICES_CONFIG": str(own.prices_config),
        "BILLING_DATABASE_URL": database_url,
        "LOG_LEVEL": "WARNING",
    }
    command = ["invoice", "--tenant", "acme", "--month", "2026-11"]
    assert await asyncio.to_thread(run, command, environ) == 0
    out = capsys.readouterr().out
    assert "already issued" in out
    assert f" {total} " in out.splitlines()[-1]
