"""The Redis ledger with a controlled clock: rounding, idempotency, expiry, prices, budgets."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_billing import invoice
from llm_billing.budgets import BudgetLimits
from llm_billing.config import RedisSettings, Settings
from llm_billing.keys import KeySpace
from llm_billing.ledger import Ledger
from llm_billing.ledger_values import Admission, ReserveInput, SettleInput, Usage
from llm_billing.prices import MAX_PRICE_MICROS_PER_MTOK, PriceBook, load_prices
from llm_billing.scripts import script_source
from llm_billing.server import Billing, build_billing
from llm_billing.timeutil import DAY_MS, HOUR_MS, Period
from llm_billing.usage import Granularity, UsageQuery, UsageTotals
from llm_common.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    QuotaExceeded,
)
from llm_common.redis_conn import open_sync_client
from llm_common.redis_mux import PoolPipeline

pytestmark = pytest.mark.integration

T0 = int(datetime(2026, 3, 10, 22, 30, tzinfo=UTC).timestamp()) * 1000
STOP = 1
TTL_MS = 600_000


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["mux", "pool"])
async def billing_at(
    request: pytest.FixtureRequest,
    settings: Settings,
    prices: PriceBook,
    clock: Clock,
    redis_client: redis.asyncio.Redis,
) -> AsyncIterator[Billing]:
    """The wired service on a fake clock; Reserve/Settle over RedisMux or, as with TLS,
    over redis-py's pool."""
    built = build_billing(settings, prices, clock=clock)
    if request.param == "pool":
        keys = KeySpace(settings.ledger.key_prefix)
        hot = PoolPipeline(built.client)
        ledger = Ledger(built.client, keys, prices, settings.ledger, clock=clock, hot=hot)
        built = dataclasses.replace(built, ledger=ledger)
    try:
        yield built
    finally:
        await built.aclose()


def reserve(rid: str, tenant: str = "acme", key: str = "k1", model: str = "small",
            prompt: int = 1000, max_completion: int = 500) -> ReserveInput:  # fmt: skip
    return ReserveInput(rid, tenant, key, model, prompt, max_completion)


def settle(rid: str, prompt: int = 1000, completion: int = 200, cached: int = 0,
           tenant: str = "", admission: Admission | None = None) -> SettleInput:  # fmt: skip
    return SettleInput(rid, tenant, Usage(prompt, completion, cached, STOP), admission)


async def dump(client: redis.asyncio.Redis, prefix: str) -> dict[str, Any]:
    """Every key under the prefix with its value (the whole ledger state)."""
    state: dict[str, Any] = {}
    async for key in client.scan_iter(match=f"{prefix}*"):
        kind = await client.type(key)
        if kind == "hash":
            state[key] = await client.hgetall(key)
        elif kind == "zset":
            state[key] = await client.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            state[key] = sorted(await client.smembers(key))
        else:
            state[key] = await client.get(key)
    return state


async def totals(b: Billing, tenant: str = "acme", key: str = "", model: str = "") -> UsageTotals:
    report = await b.usage.usage(
        UsageQuery(tenant, key, model, T0 - 40 * DAY_MS, T0 + 40 * DAY_MS, Granularity.TOTAL)
    )
    return report.total


PRICE = st.integers(0, MAX_PRICE_MICROS_PER_MTOK)
TOKENS = st.integers(0, 100_000_000)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(parts=st.lists(st.tuples(TOKENS, PRICE), min_size=1, max_size=3))
def test_lua_rounding_is_the_exact_ceiling(redis_url: str, parts: list[tuple[int, int]]) -> None:
    # The Lua cost() against exact integer arithmetic, over the whole allowed range.
    flat = ", ".join(f"{t}, {p}" for t, p in parts)
    source = script_source("expire").split("\n-- Expire:")[0] + f"\nreturn fmt(cost({{{flat}}}))"
    with open_sync_client(redis_url, decode_responses=True) as client:
        result = int(client.eval(source, 0))
    numerator = sum(t * p for t, p in parts)
    assert result == -(-numerator // 1_000_000)


async def test_reserve_settle_moves_the_hold_to_spend(
    billing_at: Billing, cost_of: Callable[..., int], reserve_of: Callable[..., int]
) -> None:
    b = billing_at
    await b.budgets.set(BudgetLimits("acme", "", Period.MONTH, 10**9, 0))
    held = await b.ledger.reserve(reserve("r1"))
    assert held.reserved_micros == reserve_of("small", 1000, 500) == 450
    assert held.expires_at_ms == T0 + TTL_MS
    status = await b.budgets.get("acme", "")
    assert (status.spent_micros, status.reserved_micros) == (0, 450)

    done = await b.ledger.settle(settle("r1", prompt=1000, completion=200, cached=100))
    assert done.charged_micros == cost_of("small", 1000, 200, 100) == 263
    assert not done.duplicate
    status = await b.budgets.get("acme", "")
    assert (status.spent_micros, status.reserved_micros) == (263, 0)
    assert await totals(b) == UsageTotals(1, 1000, 200, 100, 263)
    assert await totals(b, key="k1", model="small") == UsageTotals(1, 1000, 200, 100, 263)
    assert await totals(b, model="odd") == UsageTotals()


async def test_repeating_any_call_changes_nothing(billing_at: Billing, settings: Settings) -> None:
    b, prefix = billing_at, settings.ledger.key_prefix
    first = await b.ledger.reserve(reserve("r1"))
    before = await dump(b.client, prefix)
    again = await b.ledger.reserve(reserve("r1"))
    assert again.duplicate
    assert again.reserved_micros == first.reserved_micros
    assert again.expires_at_ms == first.expires_at_ms
    assert await dump(b.client, prefix) == before

    settled = await b.ledger.settle(settle("r1"))
    before = await dump(b.client, prefix)
    for call in (
        b.ledger.settle(settle("r1", completion=499)),  # a different retry body changes nothing
        b.ledger.settle(settle("r1", tenant="acme")),
        b.ledger.reserve(reserve("r1")),
    ):
        await call
    assert not await b.ledger.release("r1")
    assert await dump(b.client, prefix) == before
    dup = await b.ledger.settle(settle("r1"))
    assert dup.duplicate
    assert dup.charged_micros == settled.charged_micros


async def test_a_request_id_reused_with_other_arguments_is_refused(
    billing_at: Billing, settings: Settings
) -> None:
    b = billing_at
    await b.ledger.reserve(reserve("r1"))
    with pytest.raises(AlreadyExists):
        await b.ledger.reserve(reserve("r1", prompt=999))
    before = await dump(b.client, settings.ledger.key_prefix)
    with pytest.raises(AlreadyExists):
        await b.ledger.reserve(reserve("r1", tenant="other"))
    # The other tenant's reservation was undone: no record, no hold, no usage (it is only
    # listed among the tenants seen).
    after = await dump(b.client, settings.ledger.key_prefix)
    other = {k: v for k, v in after.items() if "{other}" in k or k.endswith(":tenants")}
    assert all(v == {"rs": "0"} for k, v in other.items() if ":bal:" in k), other
    assert not [k for k in other if ":rec:" in k or ":uh:" in k or ":recs" in k], other
    assert {k: v for k, v in after.items() if k not in other} == {
        k: v for k, v in before.items() if k not in other
    }
    with pytest.raises(NotFound):
        await b.ledger.settle(settle("r1", tenant="other"))


async def test_scripts_are_reloaded_after_redis_forgets_them(
    settings: Settings, prices: PriceBook, private_redis: Callable[..., Any]
) -> None:
    store = private_redis()
    own = dataclasses.replace(settings, redis=RedisSettings(store.url))
    b = build_billing(own, prices)
    try:
        await b.ledger.reserve(reserve("r1"))
        await b.client.script_flush()
        await b.ledger.reserve(reserve("r2"))
        await b.client.script_flush()
        assert (await b.ledger.settle(settle("r2"))).charged_micros > 0
    finally:
        await b.aclose()


async def test_unknown_model_and_unknown_reservation(billing_at: Billing) -> None:
    with pytest.raises(NotFound) as info:
        await billing_at.ledger.reserve(reserve("r1", model="nope"))
    assert info.value.resource_type == "price"
    with pytest.raises(NotFound):
        await billing_at.ledger.settle(settle("ghost"))
    with pytest.raises(NotFound):
        await billing_at.ledger.settle(settle("ghost", tenant="acme"))
    assert not await billing_at.ledger.release("ghost")


async def test_expired_reservation_is_charged_then_corrected_by_a_late_settle(
    billing_at: Billing, clock: Clock, cost_of: Callable[..., int]
) -> None:
    b = billing_at
    held = await b.ledger.reserve(reserve("r1"))
    await b.ledger.reserve(reserve("r2"))
    clock.now += TTL_MS - 1
    assert await b.ledger.sweep() == 0  # not yet
    clock.now += 1
    assert await b.ledger.sweep() == 2
    assert await b.ledger.sweep() == 0  # charged once
    assert await totals(b) == UsageTotals(2, 2000, 1000, 0, 2 * held.reserved_micros)
    status = await b.budgets.set(BudgetLimits("acme", "k1", Period.DAY, 0, 0))
    assert (status.spent_micros, status.reserved_micros) == (2 * held.reserved_micros, 0)

    late = await b.ledger.settle(settle("r1", completion=100))
    assert late.corrected
    actual = cost_of("small", 1000, 100)
    assert late.charged_micros == actual
    assert await totals(b) == UsageTotals(2, 2000, 600, 0, held.reserved_micros + actual)
    assert await b.ledger.release("r2")  # the request never ran: refund the expired charge
    assert not await b.ledger.release("r2")
    assert await totals(b) == UsageTotals(1, 1000, 100, 0, actual)
    status = await b.budgets.get("acme", "k1")
    assert (status.spent_micros, status.reserved_micros) == (actual, 0)

    lines = [line async for line in b.invoices.lines("acme", T0, T0 + DAY_MS)]
    assert lines[0].startswith("request_id,tenant_id,")
    assert [line.split(",")[6] for line in lines[1:]] == ["corrected"]


async def test_settle_after_release_still_charges(
    billing_at: Billing, cost_of: Callable[..., int]
) -> None:
    b = billing_at
    await b.ledger.reserve(reserve("r1"))
    assert await b.ledger.release("r1")
    assert await totals(b) == UsageTotals()
    late = await b.ledger.settle(settle("r1", completion=10))
    assert late.corrected
    assert await totals(b) == UsageTotals(1, 1000, 10, 0, cost_of("small", 1000, 10))


async def test_settle_without_reservation_records_usage_once(
    billing_at: Billing, clock: Clock, cost_of: Callable[..., int]
) -> None:
    b = billing_at
    admitted = Admission("k2", "odd", T0 - HOUR_MS)
    first = await b.ledger.settle(settle("r9", 500, 50, 5, tenant="acme", admission=admitted))
    assert first.unreserved
    assert first.charged_micros == cost_of("odd", 500, 50, 5)
    again = await b.ledger.settle(settle("r9", 500, 50, 5, tenant="acme", admission=admitted))
    assert again.duplicate
    hour = await b.usage.usage(UsageQuery("acme", "k2", "", T0 - 2 * HOUR_MS, T0, Granularity.HOUR))
    assert [bk.start_ms for bk in hour.buckets] == [(T0 - HOUR_MS) // HOUR_MS * HOUR_MS]
    assert hour.total == UsageTotals(1, 500, 50, 5, first.charged_micros)

    with pytest.raises(AlreadyExists):  # the id belongs to acme
        await b.ledger.settle(settle("r9", tenant="other", admission=admitted))
    old = Admission("k2", "odd", clock.now - 36 * DAY_MS)
    with pytest.raises(FailedPrecondition):
        await b.ledger.settle(settle("r10", tenant="acme", admission=old))
    future = Admission("k2", "odd", clock.now + DAY_MS)
    with pytest.raises(InvalidArgument):
        await b.ledger.settle(settle("r11", tenant="acme", admission=future))


async def test_a_batch_of_unreserved_settles_records_each_once(
    billing_at: Billing, cost_of: Callable[..., int]
) -> None:
    # The router's case where no budget applies: every settle of a batch without a reservation.
    b = billing_at
    admitted = Admission("k2", "small", T0 - HOUR_MS)
    await b.ledger.settle(settle("u0", 100, 10, tenant="other", admission=admitted))
    await b.ledger.reserve(reserve("u1"))
    ops = [settle(f"u{i}", 100, 10, tenant="acme", admission=admitted) for i in range(6)]
    outcomes = await b.ledger.apply_many(ops)
    assert isinstance(outcomes[0], AlreadyExists)  # u0 belongs to another tenant
    assert [getattr(o, "unreserved", None) for o in outcomes[1:]] == [False] + [True] * 4
    assert await totals(b) == UsageTotals(5, 500, 50, 0, 5 * cost_of("small", 100, 10))
    again = await b.ledger.apply_many(ops[1:])
    assert all(getattr(o, "duplicate", False) for o in again)
    assert await totals(b) == UsageTotals(5, 500, 50, 0, 5 * cost_of("small", 100, 10))


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


async def test_mixed_random_traffic_matches_an_independent_sum(
    billing_at: Billing, clock: Clock, cost_of: Callable[..., int]
) -> None:
    b, rng = billing_at, random.Random(5)
    expected = UsageTotals()
    for i in range(300):
        clock.now += rng.randrange(0, 20 * 60_000)
        model = rng.choice(["small", "odd", "big"])
        prompt, max_completion = rng.randrange(0, 5000), rng.randrange(1, 2000)
        await b.ledger.reserve(reserve(f"r{i}", model=model, prompt=prompt,
                                       max_completion=max_completion))  # fmt: skip
        fate = rng.random()
        if fate < 0.1:
            await b.ledger.release(f"r{i}")
            continue
        completion, cached = rng.randrange(0, max_completion + 1), rng.randrange(0, prompt + 1)
        if fate < 0.2:  # expires first, settles late
            clock.now += TTL_MS
            await b.ledger.sweep()
        await b.ledger.settle(settle(f"r{i}", prompt, completion, cached))
        charged = cost_of(model, prompt, completion, cached)
        expected += UsageTotals(1, prompt, completion, cached, charged)
    await b.ledger.sweep()
    report = await b.usage.usage(
        UsageQuery("acme", "", "", T0 - DAY_MS, clock.now + DAY_MS, Granularity.TOTAL)
    )
    assert report.total == expected
