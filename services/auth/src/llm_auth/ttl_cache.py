"""A bounded in-process LRU cache whose entries expire after a TTL."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Generic, TypeVar

from llm_common.bounded_map import BoundedTTLMap

K = TypeVar("K")
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """Entries live `ttl_s` seconds; beyond `max_entries` the least recently used go first.

    Not thread-safe: used from one event loop.
    """

    def __init__(
        self, ttl_s: float, max_entries: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if ttl_s < 0 or max_entries < 1:
            raise ValueError("ttl_s must be >= 0 and max_entries >= 1")
        self._clock = clock
        # Values keep their store time: `max_age_s` and `mark_stale` judge it per lookup.
        self._items: BoundedTTLMap[K, tuple[V, float]] = BoundedTTLMap(
            max_entries, ttl_s=ttl_s, clock=clock
        )
        self._stale_before = -float("inf")

    def __len__(self) -> int:
        return len(self._items)

    def put(self, key: K, value: V) -> None:
        """Store `value`, fresh from now."""
        self._items.put(key, (value, self._clock()))

    def get(self, key: K, max_age_s: float | None = None) -> V | None:
        """The value if stored less than min(ttl, max_age_s) seconds ago, else None. With
        `max_age_s`, entries stored before the last `mark_stale` count as too old."""
        item = self._items.peek(key)  # past the TTL: dropped
        if item is None:
            return None
        value, stored_at = item
        if max_age_s is not None and (
            self._clock() - stored_at >= max_age_s or stored_at <= self._stale_before
        ):
            return None
        self._items.get(key)  # marks it recently used
        return value

    def mark_stale(self) -> None:
        """Every entry stored so far fails `max_age_s` lookups from now on (it still serves
        plain lookups until its TTL)."""
        self._stale_before = self._clock()

    def pop(self, key: K) -> None:
        """Forget `key`."""
        self._items.pop(key)
