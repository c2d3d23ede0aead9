"""Keeps each replica's semantic index in step with Redis: a rebuild at start, then a
change log (a Redis stream) that every replica follows."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from llm_cache.canonical import tenant_tag
from llm_cache.metrics import CacheMetrics
from llm_cache.semantic import IndexItem, SemanticEngine
from llm_cache.store import IndexedEntry, RedisStore, StoreUnavailable
from llm_common.logging import get_logger
from llm_common.resilience import Backoff

ADD, DROP = "a", "d"
LOG_MAX_EVENTS = 100_000  # approximate stream length kept for replicas that fall behind
_READ_BLOCK_MS = 1000
_READ_COUNT = 256
_log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Change:
    """One change-log event: entries of one tenant added to or dropped from the index."""

    origin: str
    op: str
    tag: str
    entry_ids: tuple[str, ...]


class IndexSync:
    """Publishes this replica's index changes and applies everyone else's.

    Stores and removals on any replica reach the others within about a second. A replica
    that was down or lagged past the log's length misses some additions (fewer semantic
    hits, never wrong ones: every hit is read back from Redis, and ids that are gone there
    are dropped from the index).
    """

    def __init__(
        self,
        store: RedisStore,
        engine: SemanticEngine,
        follower: aioredis.Redis,
        key_prefix: str,
        metrics: CacheMetrics,
        *,
        backoff: Backoff | None = None,
    ) -> None:
        self._store = store
        self._engine = engine
        self._follower = follower  # its own connection: XREAD blocks
        self._stream = f"{key_prefix}log"
        self._metrics = metrics
        self._backoff = backoff or Backoff(base=0.5, cap=30.0, jitter=0.5)
        self.origin = uuid.uuid4().hex
        self.ready = asyncio.Event()  # set once the start-up rebuild has finished

    async def publish(self, tenant: str, op: str, entry_ids: Sequence[str]) -> None:
        """Tell the other replicas; a failure only costs them hits, so it is counted, not
        raised."""
        if not entry_ids:
            return
        fields = {"o": self.origin, "op": op, "t": tenant_tag(tenant), "ids": ",".join(entry_ids)}
        try:
            await self._store.append_log(self._stream, fields, LOG_MAX_EVENTS)
        except StoreUnavailable:
            self._metrics.sync_errors.inc()

    async def run(self) -> None:
        """Rebuild the index from Redis (retrying until Redis answers), then follow the log
        until cancelled."""
        position = await self._retrying(self._rebuild)
        self.ready.set()
        while True:
            position = await self._retrying(self._follow, position)

    async def _retrying(self, step: Callable[..., Awaitable[str]], *args: str) -> str:
        attempt = 0
        while True:
            try:
                return await step(*args)
            except (RedisError, OSError, StoreUnavailable) as exc:
                attempt += 1
                self._metrics.sync_errors.inc()
                delay = self._backoff.delay(attempt)
                _log.warning("index sync failed", error=type(exc).__name__, retry_in_s=delay)
                await asyncio.sleep(delay)

    async def _rebuild(self) -> str:
        # The log position is taken first: changes made during the scan are applied again
        # afterwards, which is harmless (put and remove are idempotent).
        position = await self._last_position()
        await self._engine.clear()
        total = 0
        for tag in await self._store.tenant_tags():
            async for batch in self._store.scan_indexed(tag):
                total += await self._index(batch)
        _log.info("semantic index rebuilt", vectors=total)
        self._metrics.index_vectors.set(self._engine.indexed)
        return position

    async def _follow(self, position: str) -> str:
        reply: Any = await self._follower.xread(
            {self._stream: position}, count=_READ_COUNT, block=_READ_BLOCK_MS
        )
        for _, events in reply or ():
            for event_id, fields in events:
                await self._apply(_parse(fields))
                position = event_id.decode()
        self._metrics.index_vectors.set(self._engine.indexed)
        return position

    async def _apply(self, change: Change | None) -> None:
        if change is None or change.origin == self.origin:
            return
        if change.op == DROP:
            await self._engine.remove(change.entry_ids)
        elif change.op == ADD:
            keys = self._store.keys_for_tag(change.tag)
            await self._index(await self._store.fetch_indexed(keys, change.entry_ids))

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

    async def _last_position(self) -> str:
        last: Any = await self._follower.xrevrange(self._stream, count=1)
        return str(last[0][0].decode()) if last else "0-0"


def _parse(fields: dict[bytes, bytes]) -> Change | None:
    try:
        ids = tuple(i for i in fields[b"ids"].decode().split(",") if i)
        return Change(fields[b"o"].decode(), fields[b"op"].decode(), fields[b"t"].decode(), ids)
    except (KeyError, UnicodeDecodeError):
        return None  # not ours: ignore rather than stall the follower
