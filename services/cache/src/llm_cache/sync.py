"""Keeps each replica's semantic index in step with Redis: a rebuild at start, then the
other replicas' changes from the change log."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
from redis.exceptions import RedisError

from llm_cache.changes import DROP, Change, ChangeLog
from llm_cache.metrics import CacheMetrics
from llm_cache.semantic import IndexItem, SemanticEngine
from llm_cache.store import IndexedEntry, RedisStore, StoreUnavailable
from llm_common.logging import get_logger
from llm_common.resilience import Backoff

_log = get_logger(__name__)


class IndexSync:
    """Rebuilds the index and applies everyone else's changes (a ChangeListener).

    Stores and removals on any replica reach the others within about a second. A replica
    that was down or lagged past the log's length misses some additions (fewer semantic
    hits, never wrong ones: every hit is read back from Redis, and ids that are gone there
    are dropped from the index).
    """

    def __init__(
        self,
        store: RedisStore,
        engine: SemanticEngine,
        log: ChangeLog,
        metrics: CacheMetrics,
        *,
        backoff: Backoff | None = None,
    ) -> None:
        self._store = store
        self._engine = engine
        self._log = log
        self._metrics = metrics
        self._backoff = backoff or Backoff(base=0.5, cap=30.0, jitter=0.5)
        self.ready = asyncio.Event()  # set once the start-up rebuild has finished

    async def run(self) -> None:
        """Rebuild the index from Redis, retrying until Redis answers.

        It starts once the log's follower has its start position: changes from then on are
        applied as they are read, also during the scan, so none falls between the two.
        Applying one twice, or before the scan, is harmless (put and remove are idempotent;
        a vector the scan re-adds after its removal is dropped at its first read-back).
        """
        await self._log.positioned.wait()
        attempt = 0
        while True:
            try:
                await self._rebuild()
                break
            except (RedisError, OSError, StoreUnavailable) as exc:
                attempt += 1
                self._metrics.sync_errors.inc()
                delay = self._backoff.delay(attempt)
                _log.warning("index rebuild failed", error=type(exc).__name__, retry_in_s=delay)
                await asyncio.sleep(delay)
        self.ready.set()

    async def changed(self, changes: Sequence[Change]) -> None:
        for change in changes:
            if change.origin != self._log.origin:  # this replica applied its own already
                await self._apply(change)
        self._metrics.index_vectors.set(self._engine.indexed)

    def interrupted(self) -> None:
        """Nothing to undo: the log resumes where it stopped."""

    async def _rebuild(self) -> None:
        await self._engine.clear()
        total = 0
        for tag in await self._store.tenant_tags():
            async for batch in self._store.scan_indexed(tag):
                total += await self._index(batch)
        _log.info("semantic index rebuilt", vectors=total)
        self._metrics.index_vectors.set(self._engine.indexed)

    async def _apply(self, change: Change) -> None:
        if change.op == DROP:
            await self._engine.remove(change.entry_ids)
            return
        # Stored: index what Redis holds now; an entry stored without a vector, or gone
        # since, must not keep an older vector here.
        keys = self._store.keys_for_tag(change.tag)
        entries = await self._store.fetch_indexed(keys, change.entry_ids)
        await self._index(entries)
        found = {e.entry_id for e in entries}
        await self._engine.remove([i for i in change.entry_ids if i not in found])

    async def _index(self, entries: list[IndexedEntry]) -> int:
        width = self._engine.dim * 4  # float32; anything else came from another encoder
        items = [
            IndexItem(e.namespace, e.entry_id, np.frombuffer(e.vector, np.float32), e.semantic_text)
            for e in entries
            if len(e.vector) == width
        ]
        indexed = await self._engine.put(items)
        if indexed < len(items):
            self._metrics.index_full.inc(len(items) - indexed)
        return indexed
