"""A bounded in-process map: least recently used entries go first, entries may expire.

Several services keep small memos (tokenized prompts, refused callers, routing placements,
recent embeddings) that must never grow without bound and must forget what is too old.
Each used to hand-roll the same OrderedDict dance; this is that dance once, tested once.

Bounds, each optional: the number of entries, the sum of the entries' weights (e.g. token
ids or bytes held), and a time to live (per map, overridable per entry). Expired entries are
dropped when they are read or when they are the least recently used, so memory stays
within the bounds without a sweeper. Not thread-safe: use it from one thread or event
loop.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


@dataclass(slots=True)
class _Slot(Generic[V]):
    value: V
    expires: float  # clock value from which the entry is gone; inf = never
    weight: int


class BoundedTTLMap(Generic[K, V]):
    """LRU map with optional count, weight and age bounds and an injectable clock.

    - `max_entries`: at most this many entries (None: no count bound).
    - `max_weight` with `weigh`: the entries' weights sum to at most this; an entry heavier
      than the whole bound is not stored (`put` returns False) and leaves any old value.
    - `ttl_s`: entries expire this long after they were put (None: never); `put(ttl_s=)`
      overrides it per entry. An entry is gone from the instant `clock() >= put time + ttl`.
    - `on_evict(key, value)`: called when the map itself removes an entry (room was needed,
      or it expired), so callers can keep side indexes in step; not for `pop`, `clear` or
      a `put` that replaces the key.
    """

    def __init__(
        self,
        max_entries: int | None = None,
        *,
        max_weight: int | None = None,
        weigh: Callable[[V], int] | None = None,
        ttl_s: float | None = None,
        on_evict: Callable[[K, V], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_entries is not None and max_entries < 0:
            raise ValueError("max_entries must be >= 0")
        if max_weight is not None and max_weight < 0:
            raise ValueError("max_weight must be >= 0")
        if (max_weight is None) != (weigh is None):
            raise ValueError("max_weight and weigh go together")
        if ttl_s is not None and ttl_s < 0:
            raise ValueError("ttl_s must be >= 0")
        self._max_entries = max_entries
        self._max_weight = max_weight
        self._weigh = weigh
        self._ttl_s = ttl_s
        self._on_evict = on_evict
        self._clock = clock
        self._slots: OrderedDict[K, _Slot[V]] = OrderedDict()
        self._weight = 0

    def __len__(self) -> int:
        """Entries held, expired ones not yet dropped included."""
        return len(self._slots)

    @property
    def weight(self) -> int:
        """The sum of the held entries' weights (0 without a weight bound)."""
        return self._weight

    def __contains__(self, key: object) -> bool:
        """Whether `key` is held and live (does not mark it used nor drop it)."""
        slot = self._slots.get(key)  # type: ignore[arg-type]
        return slot is not None and self._clock() < slot.expires

    def get(self, key: K, *, touch: bool = True) -> V | None:
        """The live value of `key`, or None. `touch` marks it most recently used; an
        expired entry is dropped either way."""
        slot = self._slots.get(key)
        if slot is None:
            return None
        if self._clock() >= slot.expires:
            self._evict(key)
            return None
        if touch:
            self._slots.move_to_end(key)
        return slot.value

    def peek(self, key: K) -> V | None:
        """`get` without marking the entry used."""
        return self.get(key, touch=False)

    def put(self, key: K, value: V, *, ttl_s: float | None = None) -> bool:
        """Store `value` as the most recently used entry, evicting the least recently used
        ones beyond the bounds. False when it weighs more than `max_weight` (not stored)."""
        weight = self._weigh(value) if self._weigh is not None else 0
        if self._max_weight is not None and weight > self._max_weight:
            return False
        ttl = self._ttl_s if ttl_s is None else ttl_s
        expires = math.inf if ttl is None else self._clock() + ttl
        old = self._slots.pop(key, None)
        if old is not None:
            self._weight -= old.weight
        self._slots[key] = _Slot(value, expires, weight)
        self._weight += weight
        self._make_room()
        return True

    def pop(self, key: K) -> V | None:
        """Remove `key`; the value it held, expired or not (so callers can update their
        side indexes), or None."""
        slot = self._slots.pop(key, None)
        if slot is None:
            return None
        self._weight -= slot.weight
        return slot.value

    def clear(self) -> None:
        self._slots.clear()
        self._weight = 0

    def items(self) -> Iterator[tuple[K, V]]:
        """Live entries, least recently used first (a snapshot: the map may change while
        the caller iterates)."""
        now = self._clock()
        return iter([(k, s.value) for k, s in self._slots.items() if now < s.expires])

    def _over(self) -> bool:
        if self._max_entries is not None and len(self._slots) > self._max_entries:
            return True
        return self._max_weight is not None and self._weight > self._max_weight

    def _make_room(self) -> None:
        # Strict LRU order, expired or not: finding expired entries first would cost a
        # scan of the whole map on every put once it is full.
        while self._over():
            self._evict(next(iter(self._slots)))

    def _evict(self, key: K) -> None:
        slot = self._slots.pop(key)
        self._weight -= slot.weight
        if self._on_evict is not None:
            self._on_evict(key, slot.value)
