"""A bounded in-process LRU cache whose entries expire after a TTL."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

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
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._clock = clock
        self._items: OrderedDict[K, tuple[V, float]] = OrderedDict()
        self._stale_before = -float("inf")

    def __len__(self) -> int:
        return len(self._items)

    def put(self, key: K, value: V) -> None:
        """Store `value`, fresh from now."""
        self._items[key] = (value, self._clock())
        self._items.move_to_end(key)
        while len(self._items) > self._max_entries:
            self._items.popitem(last=False)

    def get(self, key: K, max_age_s: float | None = None) -> V | None:
        """The value if stored less than min(ttl, max_age_s) seconds ago, else None. With
        `max_age_s`, entries stored before the last `mark_stale` count as too old."""
        item = self._items.get(key)
        if item is None:
            return None
        value, stored_at = item
        age = self._clock() - stored_at
        if age >= self._ttl_s:
            del self._items[key]
            return None
        if max_age_s is not None and (age >= max_age_s or stored_at <= self._stale_before):
            return None
        self._items.move_to_end(key)
        return value

    def mark_stale(self) -> None:
        """Every entry stored so far fails `max_age_s` lookups from now on (it still serves
        plain lookups until its TTL)."""
        self._stale_before = self._clock()

    def pop(self, key: K) -> None:
        """Forget `key`."""
        self._items.pop(key, None)
