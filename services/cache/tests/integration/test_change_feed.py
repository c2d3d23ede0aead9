"""What callers keeping exact hits near them rely on: WatchChanges reports every store and
removal (on any replica), heartbeats while idle and ends when it cannot; RecordHits
accounts their hits; Lookup hits say when they expire."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable

import grpc
import pytest
import redis.asyncio

from llm_cache.canonical import tenant_tag
from llm_cache.changes import DROP, shard_of
from llm_cache.config import Settings
from llm_cache.feed import HEARTBEAT_INTERVAL_MS, MAX_IDS_PER_MESSAGE
from llm_common.errors import parse_error
from llmapi.cache.v1 import cache_service_pb2 as pb
from llmapi.cache.v1 import cache_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

READ_TIMEOUT_S = 3.0  # well past one heartbeat


class Watch:
    """One WatchChanges stream, read message by message."""

    def __init__(self, stub: pb_grpc.CacheServiceAsyncStub) -> None:
        self.call = stub.WatchChanges(pb.WatchChangesRequest())

    async def next(self, timeout_s: float = READ_TIMEOUT_S) -> pb.WatchChangesResponse:
        message = await asyncio.wait_for(self.call.read(), timeout_s)
        assert isinstance(message, pb.WatchChangesResponse), "the stream ended"
        return message

    async def until_seen(self, *entry_ids: str) -> set[str]:
        """Reads until every id has been reported; returns all ids read meanwhile."""
        seen: set[str] = set()
        deadline = time.monotonic() + READ_TIMEOUT_S
        while not set(entry_ids) <= seen:
            seen.update((await self.next(deadline - time.monotonic())).entry_ids)
        return seen


@contextlib.asynccontextmanager
async def watching(stub: pb_grpc.CacheServiceAsyncStub) -> AsyncIterator[Watch]:
    """A stream past its first message (the feed is live)."""
    watch = Watch(stub)
    try:
        first = await watch.next()
        assert list(first.entry_ids) == []
        assert first.heartbeat_interval_ms == HEARTBEAT_INTERVAL_MS
        yield watch
    finally:
        watch.call.cancel()


@pytest.fixture
def exact_only(make_settings: Callable[..., Settings]) -> Settings:
    """No semantic engine: the change log must run without one."""
    return make_settings(enabled=False)


async def test_first_message_says_live_then_heartbeats_follow(serve_cache, exact_only) -> None:
    async with serve_cache(exact_only) as served, watching(served.stub) as watch:
        started = time.monotonic()
        heartbeat = await watch.next()
        assert list(heartbeat.entry_ids) == []
        assert heartbeat.heartbeat_interval_ms == 1000
        # The advertised interval, plus slack for a busy test machine.
        assert time.monotonic() - started < HEARTBEAT_INTERVAL_MS / 1000 + 0.25


async def test_stores_and_every_kind_of_removal_are_reported(serve_cache, exact_only, req) -> None:
    async with serve_cache(exact_only) as served, watching(served.stub) as watch:
        stub = served.stub
        key = req.key("What is the capital of Peru?")
        created = (await stub.Store(req.store(key, "Lima."))).entry_id
        await watch.until_seen(created)
        assert (await stub.Store(req.store(key, "Lima, Peru."))).entry_id == created
        await watch.until_seen(created)  # replaced

        await stub.Invalidate(pb.InvalidateRequest(tenant_id="tenant-a", entry_id=created))
        await watch.until_seen(created)

        other_model = (await stub.Store(req.store(req.key("Hi", model="other")))).entry_id
        await watch.until_seen(other_model)
        await stub.Invalidate(pb.InvalidateRequest(tenant_id="tenant-a", model="other"))
        await watch.until_seen(other_model)

        ids = [(await stub.Store(req.store(req.key(f"Question {i}")))).entry_id for i in range(3)]
        await watch.until_seen(*ids)
        await stub.Invalidate(pb.InvalidateRequest(tenant_id="tenant-a"))
        await watch.until_seen(*ids)

        wrong = (await stub.Store(req.store(key, "Quito."))).entry_id
        await watch.until_seen(wrong)
        await stub.Feedback(pb.FeedbackRequest(tenant_id="tenant-a", entry_id=wrong))
        await watch.until_seen(wrong)


async def test_a_change_on_another_replica_is_reported(make_settings, serve_cache, req) -> None:
    settings = make_settings()  # with the semantic engine: its index follows the same log
    async with (
        serve_cache(settings) as one,
        serve_cache(settings) as two,
        watching(one.stub) as watch,
    ):
        entry = (await two.stub.Store(req.store(req.key("Who wrote Hamlet?")))).entry_id
        await watch.until_seen(entry)
        await two.stub.Invalidate(pb.InvalidateRequest(tenant_id="tenant-a", entry_id=entry))
        await watch.until_seen(entry)


async def test_large_changes_arrive_in_bounded_messages(served, redis_client) -> None:
    ids = [f"{i:032x}" for i in range(2500)]
    async with watching(served.stub) as watch:
        await served.app.changes.publish(tenant_tag("tenant-a"), DROP, ids)
        seen: set[str] = set()
        while len(seen) < len(ids):
            message = await watch.next()
            assert len(message.entry_ids) <= MAX_IDS_PER_MESSAGE
            seen.update(message.entry_ids)
    assert seen == set(ids)
    # One tenant's changes go to one shard of the log, 1000 ids per event.
    stream = served.app.changes.streams[shard_of(tenant_tag("tenant-a"))]
    assert await redis_client.xlen(stream) == 3


async def test_streams_beyond_the_limit_are_refused(make_settings, serve_cache) -> None:
    async with serve_cache(make_settings(enabled=False, max_subscribers=1)) as served:
        async with watching(served.stub):
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await Watch(served.stub).next()
        error = parse_error(caught.value)
        assert error.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error.quota_violations

        deadline = time.monotonic() + READ_TIMEOUT_S
        while len(served.app.feed):  # the cancelled stream gives its place back
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        async with watching(served.stub):
            pass


async def test_stopping_ends_streams_cleanly(serve_cache, exact_only) -> None:
    async with serve_cache(exact_only) as served:
        watch = Watch(served.stub)
        await watch.next()

        served.app.stopping()

        assert await asyncio.wait_for(watch.call.read(), READ_TIMEOUT_S) is grpc.aio.EOF
        assert await watch.call.code() == grpc.StatusCode.OK
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await Watch(served.stub).next()
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_recorded_hits_count_as_exact_lookups(served, req) -> None:
    entry = (await served.stub.Store(req.store(req.key("What is 2 + 2?"), "4"))).entry_id
    await served.stub.Lookup(req.lookup(req.key("What is 2 + 2?")))

    reply = await served.stub.RecordHits(
        pb.RecordHitsRequest(
            hits=[
                pb.RecordedHit(tenant_id="tenant-a", entry_id=entry, count=3),
                pb.RecordedHit(tenant_id="tenant-b", entry_id="f" * 32, count=2),
            ]
        )
    )

    assert reply.recorded == 5
    stats = await served.stub.Stats(pb.StatsRequest(tenant_id="tenant-a"))
    assert (stats.lookups, stats.exact_hits, stats.near_hits) == (4, 4, 3)
    assert stats.exact_hit_rate == 1.0
    everyone = await served.stub.Stats(pb.StatsRequest())
    assert (everyone.lookups, everyone.exact_hits, everyone.near_hits) == (6, 6, 5)
    assert served.app.metrics.near_hits._value.get() == 5


async def test_recorded_hits_refresh_recency_of_entries_still_there(
    serve_cache, exact_only, req, redis_client: redis.asyncio.Redis
) -> None:
    async with serve_cache(exact_only) as served:
        entry = (await served.stub.Store(req.store(req.key("Name a prime."), "7"))).entry_id
        lru = served.app.store.keys("tenant-a").lru
        await redis_client.zadd(lru, {entry: 1})  # used long ago
        gone = "e" * 32

        before = time.time() * 1000
        hits = [pb.RecordedHit(tenant_id="tenant-a", entry_id=i, count=1) for i in (entry, gone)]
        await served.stub.RecordHits(pb.RecordHitsRequest(hits=hits))

        assert await redis_client.zscore(lru, entry) >= before - 1
        assert await redis_client.zscore(lru, gone) is None  # nothing is recreated


async def test_bad_hit_reports_get_invalid_argument_with_the_fields(
    make_settings, serve_cache
) -> None:
    async with serve_cache(make_settings(enabled=False, max_recorded_hits=3)) as served:
        good = pb.RecordedHit(tenant_id="t", entry_id="0" * 32, count=1)
        cases = [
            ([good] * 4, {"hits"}),
            (
                [
                    good,
                    pb.RecordedHit(tenant_id="t", entry_id="zz", count=1),
                    pb.RecordedHit(entry_id="0" * 32, count=0),
                ],
                {"hits[1].entry_id", "hits[2].tenant_id", "hits[2].count"},
            ),
            (
                [pb.RecordedHit(tenant_id="t", entry_id="0" * 32, count=1_000_001)],
                {"hits[0].count"},
            ),
        ]
        for hits, fields in cases:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await served.stub.RecordHits(pb.RecordHitsRequest(hits=hits))
            error = parse_error(caught.value)
            assert error.code == grpc.StatusCode.INVALID_ARGUMENT
            assert {v.field for v in error.field_violations} == fields
        stats = await served.stub.Stats(pb.StatsRequest())
        assert stats.lookups == 0


async def test_hits_say_when_they_expire(served, req) -> None:
    key = req.key("How can I learn to play the guitar quickly?")
    await served.stub.Store(req.store(key, ttl_seconds=100))
    wanted_ms = time.time() * 1000 + 100_000

    exact = await served.stub.Lookup(req.lookup(key))
    semantic = await served.stub.Lookup(
        req.lookup(req.key("What is the quickest way to learn to play the guitar?"), threshold=0.7)
    )
    miss = await served.stub.Lookup(req.lookup(req.key("Something else entirely")))

    assert exact.kind == pb.HIT_KIND_EXACT
    assert semantic.kind == pb.HIT_KIND_SEMANTIC
    for hit in (exact, semantic):
        assert hit.HasField("expires_at")
        assert abs(hit.expires_at.ToMilliseconds() - wanted_ms) < 2000
    assert not miss.HasField("expires_at")
