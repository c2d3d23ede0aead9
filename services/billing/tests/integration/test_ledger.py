"""The Redis ledger with a controlled clock: rounding, idempotency, expiry, settles without
a reservation, random traffic against an independent sum. Prices, budgets and usage reports:
test_ledger_budgets."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_billing.budgets import BudgetLimits
from llm_billing.config import RedisSettings, Settings
from llm_billing.ledger_values import Admission
from llm_billing.prices import MAX_PRICE_MICROS_PER_MTOK, PriceBook
from llm_billing.scripts import script_source
from llm_billing.server import Billing, build_billing
from llm_billing.timeutil import DAY_MS, HOUR_MS, Period
from llm_billing.usage import Granularity, UsageQuery, UsageTotals
from llm_common.errors import (
    AlreadyExists,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
)
from llm_common.redis_conn import open_sync_client

from .ledger_helpers import T0, TTL_MS, Clock, dump, reserve, settle, totals

pytestmark = pytest.mark.integration


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
