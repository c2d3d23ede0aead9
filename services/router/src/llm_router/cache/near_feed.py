"""What keeps the near cache honest: the cache's change feed, and the hits it served
reported back to the cache (so its stats and LRU see them)."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

import grpc
from prometheus_client import Counter

from llm_common.errors import ServiceError
from llm_common.logging import get_logger
from llm_common.resilience import Backoff
from llm_router.cache.near import NearCache
from llm_router.clients.cache import CacheClient
from llmapi.cache.v1 import cache_service_pb2 as cache_pb

MAX_REPORT_HITS = 4096  # RecordHits' limit per call
# A cache without WatchChanges (an older deployment) is asked again this rarely.
_UNIMPLEMENTED_RETRY_S = 60.0
_log = get_logger(__name__)


class NearCacheFeed:
    """Follows CacheService.WatchChanges into a NearCache; reconnects with jittered backoff.

    The near cache is used only while this stream is live: every break clears it.
    """

    def __init__(
        self,
        cache: CacheClient,
        near: NearCache,
        events: Counter,
        *,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._cache = cache
        self._near = near
        self._events = events
        self._backoff = backoff or Backoff(base=0.2, cap=5.0, jitter=0.2)
        self._rng = rng or random.Random()
        self._task: asyncio.Task[None] | None = None

    @property
    def live(self) -> bool:
        return self._near.live

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="near-cache-feed")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self._near.lost()

    async def _run(self) -> None:
        failures = 0
        while True:
            delay = None
            try:
                async for message in self._cache.watch_changes():
                    if not self._near.live:
                        _log.info("near cache feed live")
                    failures = 0
                    self._near.heard(message.heartbeat_interval_ms)
                    dropped = self._near.changed(message.entry_ids)
                    if dropped:
                        self._events.labels("invalidated").inc(dropped)
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                    delay = _UNIMPLEMENTED_RETRY_S
                log = _log.warning if self._near.live else _log.debug
                log("near cache feed broke", code=err.code().name)
            if self._near.live or len(self._near):
                self._events.labels("feed_lost").inc()
            self._near.lost()
            failures += 1
            if delay is None:
                delay = self._backoff.delay(min(failures, 16), self._rng)
            await asyncio.sleep(delay)


class HitReporter:
    """Counts near-cache hits per entry and sends them to RecordHits every interval.

    A failed report is kept for the next round, up to MAX_REPORT_HITS distinct entries;
    beyond that hits are dropped (counted): they are statistics, not money.
    """

    def __init__(
        self,
        cache: CacheClient,
        events: Counter,
        *,
        interval_s: float,
        timeout_s: float,
    ) -> None:
        self._cache = cache
        self._events = events
        self._interval_s = interval_s
        self._timeout_s = timeout_s
        self._pending: dict[tuple[str, str], int] = {}
        self._task: asyncio.Task[None] | None = None

    @property
    def pending(self) -> int:
        """Hits recorded and not yet reported."""
        return sum(self._pending.values())

    def record(self, tenant_id: str, entry_id: str) -> None:
        key = (tenant_id, entry_id)
        if key not in self._pending and len(self._pending) >= MAX_REPORT_HITS:
            self._events.labels("report_dropped").inc()
            return
        self._pending[key] = self._pending.get(key, 0) + 1

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="near-cache-hits")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.flush()

    async def flush(self) -> None:
        pending, self._pending = self._pending, {}
        if not pending:
            return
        hits = [
            cache_pb.RecordedHit(tenant_id=tenant, entry_id=entry, count=count)
            for (tenant, entry), count in pending.items()
        ]
        try:
            await self._cache.record_hits(hits, self._timeout_s)
        except ServiceError as err:  # e.g. an old cache (UNIMPLEMENTED), an outage
            _log.info("near cache hit report failed", code=err.code.name)
            self._events.labels("report_failed").inc()
            for key, count in pending.items():
                self._restore(key, count)

    def _restore(self, key: tuple[str, str], count: int) -> None:
        if key in self._pending or len(self._pending) < MAX_REPORT_HITS:
            self._pending[key] = self._pending.get(key, 0) + count
        else:
            self._events.labels("report_dropped").inc()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.flush()


@dataclass(frozen=True, slots=True)
class NearCacheParts:
    """The near cache and what keeps it honest, started and stopped together."""

    cache: NearCache
    feed: NearCacheFeed
    reporter: HitReporter

    def start(self) -> None:
        self.feed.start()
        self.reporter.start()

    async def stop(self) -> None:
        await self.feed.stop()
        await self.reporter.stop()  # sends the last hits
