"""The Lua limiter against a real Redis: buckets, reservations and concurrency leases."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from llm_auth.config import RedisSettings
from llm_auth.keyspace import Keyspace
from llm_auth.limiter import BucketSpec, Limiter, RefundStatus
from llm_auth.redis_guard import RedisGuard, connect

pytestmark = pytest.mark.integration
TENANT = "acme"


@pytest_asyncio.fixture
async def limiter(redis_url: str, prefix: str) -> AsyncIterator[Limiter]:
    settings = RedisSettings(url=redis_url, prefix=prefix)
    client = connect(settings)
    limiter = Limiter(RedisGuard(client, settings), Keyspace(prefix))
    try:
        yield limiter
    finally:
        await limiter.aclose()
        await client.aclose()


async def test_a_burst_gets_exactly_the_limit(limiter: Limiter) -> None:
    bucket = BucketSpec("req:key:k1", limit=10)
    decisions = await asyncio.gather(*(limiter.hit(TENANT, [bucket], 1) for _ in range(25)))
    assert sum(d.allowed for d in decisions) == 10
    denied = [d for d in decisions if not d.allowed]
    # One unit refills every 6 s at 10/min: the retry hint says so.
    assert all(5.0 < d.retry_after_s <= 6.0 for d in denied)
    assert sorted(d.states[0].remaining for d in decisions if d.allowed) == list(range(10))


async def test_tokens_refill_continuously(limiter: Limiter) -> None:
    bucket = BucketSpec("req:key:slow", limit=2, period_s=2.0)  # one unit per second
    assert (await limiter.hit(TENANT, [bucket], 1)).allowed
    assert (await limiter.hit(TENANT, [bucket], 1)).allowed
    denied = await limiter.hit(TENANT, [bucket], 1)
    assert not denied.allowed
    assert 0 < denied.retry_after_s <= 1.0
    await asyncio.sleep(denied.retry_after_s + 0.05)
    assert (await limiter.hit(TENANT, [bucket], 1)).allowed


async def test_check_only_does_not_charge(limiter: Limiter) -> None:
    bucket = BucketSpec("tok:key:k", limit=5)
    for _ in range(3):
        decision = await limiter.hit(TENANT, [bucket], 0)
        assert decision.allowed
        assert decision.states[0].remaining == 5
    assert (await limiter.hit(TENANT, [bucket], 5)).allowed
    assert not (await limiter.hit(TENANT, [bucket], 0)).allowed


async def test_all_buckets_or_none(limiter: Limiter) -> None:
    key, tenant = BucketSpec("tok:key:a", limit=100), BucketSpec("tok:tenant", limit=30)
    assert (await limiter.hit(TENANT, [key, tenant], 20)).allowed
    decision = await limiter.hit(TENANT, [key, tenant], 20)
    assert not decision.allowed
    assert [s.remaining for s in decision.states] == [80, 10]  # nothing charged


async def test_cost_above_the_limit_is_impossible(limiter: Limiter) -> None:
    decision = await limiter.hit(TENANT, [BucketSpec("tok:key:b", limit=10)], 11)
    assert not decision.allowed
    assert decision.impossible


async def test_reservations_are_idempotent_and_refunded_once(limiter: Limiter) -> None:
    buckets = [BucketSpec("tok:key:r", limit=1000)]
    first = await limiter.reserve(TENANT, "req-1", buckets, 600, ttl_s=60)
    assert first.decision.allowed
    assert not first.duplicate
    assert first.decision.states[0].remaining == 400
    again = await limiter.reserve(TENANT, "req-1", buckets, 600, ttl_s=60)
    assert again.decision.allowed
    assert again.duplicate
    assert again.decision.states[0].remaining == 400
    assert not (await limiter.reserve(TENANT, "req-2", buckets, 600, ttl_s=60)).decision.allowed

    too_much = await limiter.refund(TENANT, "req-1", buckets, 700)
    assert (too_much.status, too_much.reserved) == (RefundStatus.EXCEEDS, 600)
    refund = await limiter.refund(TENANT, "req-1", buckets, 500)
    assert refund.status is RefundStatus.REFUNDED
    assert refund.remaining[0] == 900
    repeat = await limiter.refund(TENANT, "req-1", buckets, 500)
    assert repeat.status is RefundStatus.ALREADY_REFUNDED
    assert repeat.remaining[0] == 900
    unknown = await limiter.refund(TENANT, "never", buckets, 1)
    assert unknown.status is RefundStatus.UNKNOWN


async def test_refunds_never_overfill(limiter: Limiter) -> None:
    buckets = [BucketSpec("tok:key:o", limit=100, period_s=0.1)]
    assert (await limiter.reserve(TENANT, "r", buckets, 10, ttl_s=60)).decision.allowed
    await asyncio.sleep(0.12)  # refilled to the limit meanwhile
    refund = await limiter.refund(TENANT, "r", buckets, 10)
    assert refund.remaining == (100,)


async def test_concurrency_leases(limiter: Limiter) -> None:
    acquired = [await limiter.acquire(TENANT, "k", 2, f"lease-{i}", ttl_s=60) for i in range(3)]
    assert [lease.acquired for lease in acquired] == [True, True, False]
    assert [lease.in_use for lease in acquired] == [1, 2, 2]
    assert acquired[2].retry_after_s > 50
    renewed = await limiter.acquire(TENANT, "k", 2, "lease-0", ttl_s=60)
    assert renewed.acquired
    assert renewed.in_use == 2
    assert await limiter.release(TENANT, "k", "lease-0")
    assert not await limiter.release(TENANT, "k", "lease-0")
    assert (await limiter.acquire(TENANT, "k", 2, "lease-3", ttl_s=60)).acquired


async def test_expired_leases_free_their_slots(limiter: Limiter) -> None:
    crashed = await limiter.acquire(TENANT, "c", 1, "crashed", ttl_s=0.15)
    assert crashed.acquired
    assert not (await limiter.acquire(TENANT, "c", 1, "next", ttl_s=60)).acquired
    await asyncio.sleep(0.2)
    assert (await limiter.acquire(TENANT, "c", 1, "next", ttl_s=60)).acquired
    assert not await limiter.release(TENANT, "c", "crashed")  # had expired


async def test_tenants_do_not_share_buckets(limiter: Limiter) -> None:
    bucket = BucketSpec("req:tenant", limit=1)
    assert (await limiter.hit("a", [bucket], 1)).allowed
    assert (await limiter.hit("b", [bucket], 1)).allowed
    assert not (await limiter.hit("a", [bucket], 1)).allowed
