"""Exact cache hits kept in the router, so a repeated request skips the cache round trip.

A hit costs the cache service a gRPC call, a Redis script and a protobuf copy each time;
the router holds the answer already. Copies are only safe while the router hears about
every change, so the cache's change feed (CacheService.WatchChanges, see near_feed) is the
condition for using any: entries whose id changed are dropped as the change arrives, and
everything is dropped the moment the feed is lost or falls silent. Within that, an entry
lives at most `ttl_s` (which bounds what the feed cannot report, such as Redis evicting
under memory pressure) and never past the cache entry's own expiry.

Entries are keyed by the whole LookupRequest (tenant, model, prompt ids, messages,
sampling, options), so tenants never share one; bounded by count and bytes (LRU).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from llm_common.bounded_map import BoundedTTLMap
from llmapi.cache.v1 import cache_service_pb2 as cache_pb

MIB = 1 << 20
# Ids changed recently enough that a lookup still in flight may have read them before the
# change: a put for one of them is refused when its lookup began before the change.
_RECENT_CHANGES = 65536
_SILENT_HEARTBEATS = 3  # the feed counts as lost after this many missed heartbeats


@dataclass(frozen=True, slots=True)
class NearCacheSettings:
    """Up to `max_entries` hits (0 = off) and `max_bytes` of them, each for `ttl_s`; hits
    are reported to the cache every `report_interval_s`."""

    max_entries: int = 10_000
    max_bytes: int = 64 * MIB
    ttl_s: float = 10.0
    report_interval_s: float = 1.0

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0 and self.max_bytes > 0


@dataclass(slots=True)
class _Entry:
    response: cache_pb.LookupResponse
    entry_id: str
    size: int


def _size(entry: _Entry) -> int:
    return entry.size


def near_key(request: cache_pb.LookupRequest) -> bytes:
    """A fixed-size digest of everything that decides a lookup's answer."""
    return hashlib.blake2b(request.SerializeToString(deterministic=True), digest_size=16).digest()


class NearCache:
    """An LRU of exact hits, usable only while the change feed is live."""

    def __init__(
        self,
        settings: NearCacheSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._wall = wall
        # Expiry is per entry (never past the cache entry's own); on_evict keeps _by_id in
        # step when the map drops an entry for room or age.
        self._entries: BoundedTTLMap[bytes, _Entry] = BoundedTTLMap(
            settings.max_entries,
            max_weight=settings.max_bytes,
            weigh=_size,
            on_evict=self._unindex,
            clock=clock,
        )
        self._by_id: dict[str, set[bytes]] = {}
        self._seq = 0  # counts feed messages that changed something
        # id -> seq of its last change; an id pushed out raises _forgotten_seq.
        self._changed: BoundedTTLMap[str, int] = BoundedTTLMap(
            _RECENT_CHANGES, on_evict=self._forget_change
        )
        self._forgotten_seq = 0  # the newest seq dropped from _changed
        self._live_until = 0.0  # monotonic; 0 = the feed is not live
        self._epoch = 0  # bumped whenever the feed is lost: older lookups must not put

    @property
    def live(self) -> bool:
        return self._live_until > self._clock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size_bytes(self) -> int:
        return self._entries.weight

    def heard(self, heartbeat_interval_ms: int) -> None:
        """The feed spoke: it is live for the next few heartbeats."""
        if not self.live:
            # (Re)connected: a lookup begun before may have read an entry whose change
            # fell in the gap, so it must not be kept.
            self.lost()
        interval_s = max(heartbeat_interval_ms, 100) / 1000
        self._live_until = self._clock() + interval_s * _SILENT_HEARTBEATS

    def lost(self) -> None:
        """The feed broke: nothing kept can be trusted any more."""
        self._live_until = 0.0
        self._epoch += 1
        self.clear()

    def clear(self) -> None:
        self._entries.clear()
        self._by_id.clear()

    def changed(self, entry_ids: Iterable[str]) -> int:
        """Drop every copy of `entry_ids`; returns how many were dropped."""
        ids = list(entry_ids)
        if not ids:
            return 0
        self._seq += 1
        dropped = 0
        for entry_id in ids:
            self._changed.put(entry_id, self._seq)
            for key in self._by_id.pop(entry_id, ()):
                dropped += self._drop(key)
        return dropped

    def begin(self) -> tuple[int, int]:
        """A token to pass to `put` for a lookup starting now."""
        return self._epoch, self._seq

    def get(self, key: bytes) -> cache_pb.LookupResponse | None:
        if not self._entries:
            return None
        now = self._clock()
        if self._live_until <= now:
            self.lost()
            return None
        entry = self._entries.get(key)  # an expired entry is dropped (and unindexed) here
        return None if entry is None else entry.response

    def put(self, key: bytes, response: cache_pb.LookupResponse, since: tuple[int, int]) -> bool:
        """Keep an exact hit from a lookup that began at `since`; False when it may be stale
        or cannot be kept."""
        epoch, seq = since
        entry_id = response.entry_id
        if epoch != self._epoch or not self.live or not entry_id:
            return False
        if (self._changed.peek(entry_id) or 0) > seq or self._forgotten_seq > seq:
            return False  # changed while the lookup was in flight
        ttl_s = self._ttl(response)
        size = response.ByteSize() + len(key) + 64
        if ttl_s is None or size > self._settings.max_bytes:
            return False
        self._drop(key)
        self._by_id.setdefault(entry_id, set()).add(key)
        self._entries.put(key, _Entry(response, entry_id, size), ttl_s=ttl_s)
        return True

    def _ttl(self, response: cache_pb.LookupResponse) -> float | None:
        ttl_s = self._settings.ttl_s
        if response.HasField("expires_at"):
            left = response.expires_at.ToMilliseconds() / 1000 - self._wall()
            ttl_s = min(ttl_s, left)
        return ttl_s if ttl_s > 0 else None

    def _forget_change(self, _entry_id: str, seq: int) -> None:
        self._forgotten_seq = max(self._forgotten_seq, seq)

    def _drop(self, key: bytes) -> int:
        entry = self._entries.pop(key)
        if entry is None:
            return 0
        self._unindex(key, entry)
        return 1

    def _unindex(self, key: bytes, entry: _Entry) -> None:
        keys = self._by_id.get(entry.entry_id)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_id[entry.entry_id]
