"""The Redis ledger with a controlled clock: price changes, tenant and key budgets (hard, soft,
concurrent), usage buckets and the invoice export."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
import redis.asyncio

from llm_billing import invoice
from llm_billing.budgets import BudgetLimits
from llm_billing.config import Settings
from llm_billing.prices import load_prices
from llm_billing.server import Billing, build_billing
from llm_billing.timeutil import DAY_MS, HOUR_MS, Period
from llm_billing.usage import Granularity, UsageQuery
from llm_common.errors import (
    QuotaExceeded,
)

from .ledger_helpers import T0, Clock, reserve, settle

pytestmark = pytest.mark.integration


async def test_price_change_applies_to_requests_admitted_after_it(
    settings: Settings, clock: Clock, tmp_path: Path, redis_client: redis.asyncio.Redis
) -> None:
    change = datetime.fromtimestamp((T0 + HOUR_MS) / 1000, UTC).isoformat()
    path = tmp_path / "changing.yaml"
    path.write_text(
        "prices:\n"
        "  - {model: m, effective_from: '2020-01-01T00:00:00Z', input_micros_per_mtok: 1000000,"
        " output_micros_per_mtok: 2000000, cached_input_micros_per_mtok: 500000}\n"
        f"  - {{model: m, effective_from: '{change}', input_micros_per_mtok: 3000000,"
        " output_micros_per_mtok: 4000000, cached_input_micros_per_mtok: 500000}\n",
        encoding="utf-8",
    )
    b = build_billing(settings, load_prices(path, "USD"), clock=clock)
    try:
        clock.now = T0 + HOUR_MS - 1
        await b.ledger.reserve(reserve("before", model="m", prompt=10, max_completion=10))
        clock.now = T0 + HOUR_MS
        await b.ledger.reserve(reserve("after", model="m", prompt=10, max_completion=10))
        clock.now += 1000
        old = await b.ledger.settle(settle("before", prompt=10, completion=10))
        new = await b.ledger.settle(settle("after", prompt=10, completion=10))
        assert (old.charged_micros, new.charged_micros) == (30, 70)
    finally:
        await b.aclose()


async def test_hard_and_soft_limits_with_a_daily_reset(billing_at: Billing, clock: Clock) -> None:
    b = billing_at
    await b.budgets.set(BudgetLimits("acme", "", Period.DAY, 1000, 600))
    first = await b.ledger.reserve(reserve("r1", prompt=1000, max_completion=500))  # 450
    assert not first.soft_limit_exceeded
    second = await b.ledger.reserve(reserve("r2", prompt=1000, max_completion=500))  # 900
    assert second.soft_limit_exceeded
    with pytest.raises(QuotaExceeded) as info:
        await b.ledger.reserve(reserve("r3", prompt=1000, max_completion=500))
    (violation,) = info.value.violations
    assert violation.subject == "tenant:acme"
    assert "1000" in violation.description
    assert info.value.retry_after_s == pytest.approx((T0 // DAY_MS + 1) * DAY_MS / 1000 - T0 / 1000)
    # A refused request holds nothing and can be retried once the period resets.
    clock.now = (T0 // DAY_MS + 1) * DAY_MS
    third = await b.ledger.reserve(reserve("r3", prompt=1000, max_completion=500))
    assert not third.duplicate
    status = await b.budgets.get("acme", "")
    assert (status.spent_micros, status.reserved_micros) == (0, 450)
    assert status.resets_at_ms == clock.now + DAY_MS


async def test_key_budget_is_checked_next_to_the_tenant_budget(billing_at: Billing) -> None:
    b = billing_at
    await b.budgets.set(BudgetLimits("acme", "k1", Period.TOTAL, 500, 0))
    await b.ledger.reserve(reserve("r1"))
    with pytest.raises(QuotaExceeded) as info:
        await b.ledger.reserve(reserve("r2"))
    assert info.value.violations[0].subject == "key:k1"
    assert info.value.retry_after_s is None  # a TOTAL budget never resets
    assert not (await b.ledger.reserve(reserve("r2", key="k2"))).duplicate


async def test_concurrent_reserves_never_pass_a_hard_limit(
    billing_at: Billing, reserve_of: Callable[..., int]
) -> None:
    b, amount = billing_at, reserve_of("small", 1000, 500)
    await b.budgets.set(BudgetLimits("acme", "", Period.TOTAL, 37 * amount + amount // 2, 0))

    async def attempt(i: int) -> bool:
        try:
            await b.ledger.reserve(reserve(f"r{i}"))
        except QuotaExceeded:
            return False
        return True

    admitted = await asyncio.gather(*(attempt(i) for i in range(200)))
    assert sum(admitted) == 37
    status = await b.budgets.get("acme", "")
    assert status.reserved_micros == 37 * amount


async def test_usage_buckets_by_hour_day_and_total(billing_at: Billing, clock: Clock) -> None:
    b = billing_at
    # 22:30, 23:30 on day D, 00:30 on day D+1.
    for i in range(3):
        clock.now = T0 + i * HOUR_MS
        await b.ledger.reserve(reserve(f"r{i}", key="k1" if i < 2 else "k2"))
        await b.ledger.settle(settle(f"r{i}", prompt=1000, completion=100 * (i + 1)))

    def query(granularity: Granularity, key: str = "") -> UsageQuery:
        return UsageQuery("acme", key, "", T0 - 3 * HOUR_MS, T0 + 3 * HOUR_MS, granularity)

    hours = await b.usage.usage(query(Granularity.HOUR))
    assert [bk.start_ms for bk in hours.buckets] == [
        T0 - HOUR_MS // 2 + i * HOUR_MS for i in range(3)
    ]
    assert [bk.totals.completion_tokens for bk in hours.buckets] == [100, 200, 300]
    days = await b.usage.usage(
        UsageQuery("acme", "", "", T0 - DAY_MS, T0 + 2 * DAY_MS, Granularity.DAY)
    )
    assert [bk.totals.requests for bk in days.buckets] == [2, 1]
    total = await b.usage.usage(query(Granularity.TOTAL))
    assert total.total == hours.total == days.total
    assert total.total.completion_tokens == 600
    assert (await b.usage.usage(query(Granularity.TOTAL, "k2"))).total.requests == 1
    # A range of whole days is read from day counters, its edges from hour counters.
    wide = await b.usage.usage(
        UsageQuery("acme", "", "", T0 - 30 * DAY_MS, T0 + 30 * DAY_MS, Granularity.TOTAL)
    )
    assert wide.total == total.total


async def test_export_pages_through_requests_admitted_in_the_same_millisecond(
    billing_at: Billing, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(invoice, "PAGE", 3)
    b = billing_at
    rids = [f"r{i:02d}" for i in range(10)]
    for rid in rids:
        await b.ledger.reserve(reserve(rid))
        await b.ledger.settle(settle(rid))
    await b.ledger.reserve(reserve("open"))  # open reservations are not invoiced
    lines = [line async for line in b.invoices.lines(None, T0, T0 + 1)]
    assert [line.split(",")[0] for line in lines[1:]] == rids
    first = lines[1].split(",")
    assert first[1:8] == ["acme", "k1", "small", "2026-03-10T22:30:00.000Z",
                          "2026-03-10T22:30:00.000Z", "settled", "1000"]  # fmt: skip
    assert first[-2:] == ["USD", "stop"]
