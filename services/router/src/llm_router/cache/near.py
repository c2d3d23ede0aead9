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
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

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
    expires: float  # monotonic


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
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._by_id: dict[str, set[bytes]] = {}
        self._bytes = 0
        self._seq = 0  # counts feed messages that changed something
        self._changed: OrderedDict[str, int] = OrderedDict()  # id -> seq of its last change
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
        return self._bytes

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
        self._bytes = 0

    def changed(self, entry_ids: Iterable[str]) -> int:
        """Drop every copy of `entry_ids`; returns how many were dropped."""
        ids = list(entry_ids)
        if not ids:
            return 0
        self._seq += 1
        dropped = 0
        for entry_id in ids:
            self._changed[entry_id] = self._seq
            self._changed.move_to_end(entry_id)
            for key in self._by_id.pop(entry_id, ()):
                dropped += self._drop(key)
        while len(self._changed) > _RECENT_CHANGES:
            _, seq = self._changed.popitem(last=False)
            self._forgotten_seq = max(self._forgotten_seq, seq)
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
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.expires <= now:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return entry.response

    def put(self, key: bytes, response: cache_pb.LookupResponse, since: tuple[int, int]) -> bool:
        """Keep an exact hit from a lookup that began at `since`; False when it may be stale
        or cannot be kept."""
        epoch, seq = since
        entry_id = response.entry_id
        if epoch != self._epoch or not self.live or not entry_id:
            return False
        if self._changed.get(entry_id, 0) > seq or self._forgotten_seq > seq:
            return False  # changed while the lookup was in flight
        expires = self._expiry(response)
        size = response.ByteSize() + len(key) + 64
        if expires is None or size > self._settings.max_bytes:
            return False
        self._drop(key)
        self._entries[key] = _Entry(response, entry_id, size, expires)
        self._by_id.setdefault(entry_id, set()).add(key)
        self._bytes += size
        self._shrink()
        return True

    def _expiry(self, response: cache_pb.LookupResponse) -> float | None:
        now = self._clock()
        expires = now + self._settings.ttl_s
        if response.HasField("expires_at"):
            left = response.expires_at.ToMilliseconds() / 1000 - self._wall()
            expires = min(expires, now + left)
        return expires if expires > now else None

    def _shrink(self) -> None:
        s = self._settings
        while self._entries and (len(self._entries) > s.max_entries or self._bytes > s.max_bytes):
            self._drop(next(iter(self._entries)))

    def _drop(self, key: bytes) -> int:
        entry = self._entries.pop(key, None)
        if entry is None:
            return 0
        self._bytes -= entry.size
        keys = self._by_id.get(entry.entry_id)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del self._by_id[entry.entry_id]
        return 1
