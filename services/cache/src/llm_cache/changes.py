"""The replicas' change log: Redis streams of entry ids that were stored or removed, which
every replica publishes to and follows (for its semantic index and the WatchChanges feed).

The log is sharded: a tenant's changes go to one of LOG_SHARDS streams (chosen by its tag),
and each stream's hash tag lies in its own stretch of the 16,384 cluster slots, so on a Redis
Cluster the appends of all tenants spread over the masters instead of making one hot slot.
A tenant's changes stay in order (one stream); different tenants' may interleave.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
import zlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis.asyncio as aioredis
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot
from redis.exceptions import RedisError

from llm_cache.metrics import CacheMetrics
from llm_cache.store import RedisStore, StoreUnavailable
from llm_common.logging import get_logger
from llm_common.resilience import Backoff

# Ops: stored and indexed by its origin ("a"), stored without a vector there ("p"), removed
# ("d"). Whatever the op, the id's content changed: copies of it elsewhere are stale.
ADD, PUT, DROP = "a", "p", "d"
# Eight streams: more than the masters of a typical cluster (so each gets some), few enough
# that following them (one blocking read each) costs a replica eight connections.
LOG_SHARDS = 8
LOG_MAX_EVENTS = 100_000  # approximate events kept over all shards, for replicas that fall behind
IDS_PER_EVENT = 1000  # a tenant-wide invalidation becomes many small events, not one huge one
# Events whose append failed, appended again before each read. A change that never reaches
# the log leaves stale copies in every caller's near cache until their own TTL.
MAX_UNSENT_EVENTS = 10_000
# A quiet log still answers this often, below the feed's 1 s heartbeat with room for the
# round trip and the listeners.
READ_BLOCK_MS = 900
_READ_COUNT = 256
_log = get_logger(__name__)


def log_streams(key_prefix: str, shards: int = LOG_SHARDS) -> tuple[str, ...]:
    """The shards' stream keys: shard i's hash tag is the first `log-i-<n>` whose slot lies in
    the i-th of `shards` equal stretches of the slot space (contiguous slot ranges, as
    clusters assign them, then hold shards in proportion)."""
    streams = []
    for shard in range(shards):
        low = shard * REDIS_CLUSTER_HASH_SLOTS // shards
        high = (shard + 1) * REDIS_CLUSTER_HASH_SLOTS // shards
        for n in itertools.count():
            tag = f"{{log-{shard}-{n}}}"
            if low <= key_slot(tag.encode()) < high:
                streams.append(f"{key_prefix}log:{tag}")
                break
    return tuple(streams)


def shard_of(tag: str, shards: int = LOG_SHARDS) -> int:
    """The shard of a tenant's changes (stable across processes, unlike hash())."""
    return zlib.crc32(tag.encode()) % shards


@dataclass(frozen=True, slots=True)
class Change:
    """One change-log event: entries of one tenant (by tag) stored or removed."""

    origin: str
    op: str
    tag: str
    entry_ids: tuple[str, ...]


class ChangeListener(Protocol):
    """What follows the log through a ChangeLog."""

    async def changed(self, changes: Sequence[Change]) -> None:
        """One read of the log, oldest first; empty when nothing changed (the log was quiet
        for READ_BLOCK_MS, or the follower has just found its start position)."""

    def interrupted(self) -> None:
        """A read failed; following resumes where it stopped once Redis answers."""


class ChangeLog:
    """Publishes this replica's changes and follows everyone's, its own included.

    Following starts at the log's end (changes from then on) on a connection of its own
    (XREAD blocks); each read goes to every listener in turn. After a failure it resumes
    from the last event read, so listeners miss nothing the stream still holds.
    """

    def __init__(
        self,
        store: RedisStore,
        follower: aioredis.Redis,
        key_prefix: str,
        metrics: CacheMetrics,
        *,
        backoff: Backoff | None = None,
    ) -> None:
        self._store = store
        self._follower = follower
        self.streams = log_streams(key_prefix)
        self._max_per_stream = LOG_MAX_EVENTS // len(self.streams)
        self._metrics = metrics
        self._backoff = backoff or Backoff(base=0.25, cap=5.0, jitter=0.25)
        self._listeners: list[ChangeListener] = []
        self._unsent: deque[_Unsent] = deque()
        self._telling = asyncio.Lock()  # one shard's read reaches the listeners at a time
        self._stopped = False
        self._resending = asyncio.Lock()
        self.origin = uuid.uuid4().hex
        self.positioned = asyncio.Event()  # set once the start position is known

    def listen(self, listener: ChangeListener) -> None:
        """Add a listener; they hear each read in the order they were added."""
        self._listeners.append(listener)

    async def publish(self, tag: str, op: str, entry_ids: Sequence[str]) -> None:
        """Append a change. Never raises: when Redis fails the events are kept and appended
        again before the follower's next read."""
        if not entry_ids:
            return
        chunks = (entry_ids[i : i + IDS_PER_EVENT] for i in range(0, len(entry_ids), IDS_PER_EVENT))
        events = [{"o": self.origin, "op": op, "t": tag, "ids": ",".join(c)} for c in chunks]
        stream = self.streams[shard_of(tag, len(self.streams))]
        try:
            await self._store.append_log(stream, events, self._max_per_stream)
        except StoreUnavailable:
            self._metrics.sync_errors.inc()
            self._keep(stream, events)

    def stop(self) -> None:
        """End following within one blocking read (READ_BLOCK_MS). Closing relies on this,
        not on cancelling alone: a cancellation that lands as redis-py's socket timeout
        expires can be turned into a TimeoutError, which a follower would retry forever."""
        self._stopped = True

    async def run(self) -> None:
        """Follow every shard until stopped or cancelled, retrying with backoff while Redis
        fails."""
        positions = await self._start_positions()
        self.positioned.set()
        await self._tell([])  # every change from here on will be read
        async with asyncio.TaskGroup() as group:
            for stream, position in zip(self.streams, positions, strict=True):
                group.create_task(self._follow(stream, position))

    async def _start_positions(self) -> list[str]:
        failures = 0
        while True:
            try:
                return [await self._last_position(stream) for stream in self.streams]
            except Exception as exc:
                failures += 1
                await self._interrupted(failures, exc)

    async def _follow(self, stream: str, position: str) -> None:
        failures = 0
        while not self._stopped:
            try:
                position = await self._read(stream, position)
                failures = 0
            except Exception as exc:
                failures += 1
                await self._interrupted(failures, exc)

    async def _read(self, stream: str, position: str) -> str:
        await self._resend()
        reply: Any = await self._follower.xread(
            {stream: position}, count=_READ_COUNT, block=READ_BLOCK_MS
        )
        changes = []
        for _, events in reply or ():
            for event_id, fields in events:
                change = _parse(fields)
                if change is not None:
                    changes.append(change)
                position = event_id.decode()
        await self._tell(changes)
        return position

    async def _tell(self, changes: list[Change]) -> None:
        async with self._telling:
            for listener in self._listeners:
                await listener.changed(changes)

    async def _interrupted(self, failures: int, exc: Exception) -> None:
        """A read failed: tell the listeners, back off. Any error, bugs included: following
        must not end for good (the feed's streams would hang)."""
        if isinstance(exc, (RedisError, OSError, StoreUnavailable)):
            error = type(exc).__name__
        else:
            _log.exception("change log follower failed")
            error = "unexpected"
        self._metrics.sync_errors.inc()
        for listener in self._listeners:
            listener.interrupted()
        delay = self._backoff.delay(failures)
        _log.warning("change log read failed", error=error, retry_in_s=delay)
        await asyncio.sleep(delay)

    def _keep(self, stream: str, events: list[dict[str, str]]) -> None:
        if len(self._unsent) + len(events) > MAX_UNSENT_EVENTS:
            self._metrics.changes_lost.inc(len(events))
            return
        self._unsent.extend(_Unsent(stream, fields) for fields in events)

    async def _resend(self) -> None:
        """Append the kept events, by stream. One reader at a time pops them, after they
        were appended; publishers only add at the other end meanwhile. When one stream's
        append fails after another's succeeded, the latter's events are appended again
        later: a change heard twice only invalidates twice."""
        if not self._unsent or self._resending.locked():
            return
        async with self._resending:
            count = len(self._unsent)
            by_stream: dict[str, list[dict[str, str]]] = {}
            for kept in itertools.islice(self._unsent, count):
                by_stream.setdefault(kept.stream, []).append(kept.fields)
            try:
                for stream, events in by_stream.items():
                    await self._store.append_log(stream, events, self._max_per_stream)
            except StoreUnavailable:
                self._metrics.sync_errors.inc()
                return
            for _ in range(count):
                self._unsent.popleft()

    async def _last_position(self, stream: str) -> str:
        last: Any = await self._follower.xrevrange(stream, count=1)
        return str(last[0][0].decode()) if last else "0-0"


@dataclass(frozen=True, slots=True)
class _Unsent:
    """An event whose append failed, and the stream it belongs to."""

    stream: str
    fields: dict[str, str]


def _parse(fields: dict[bytes, bytes]) -> Change | None:
    try:
        ids = tuple(i for i in fields[b"ids"].decode().split(",") if i)
        return Change(fields[b"o"].decode(), fields[b"op"].decode(), fields[b"t"].decode(), ids)
    except (KeyError, UnicodeDecodeError):
        return None  # not ours: ignore rather than stall the follower
