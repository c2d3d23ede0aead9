"""Failed-authentication throttling per client address and per key id (issue 32, finding 5).

In-process leaky buckets: each failure adds 1 to its address's and its key id's level, which
drains at `limit / window_s` per second. A level at `limit` means `limit` failures within about
a window. Then:

- an address over its limit gets 429 (RESOURCE_EXHAUSTED + RetryInfo) for every request,
  before any credential is verified: guessing from one address costs it nothing but time.
  Each refused request tops its level back up to the limit, so it stays refused for one
  drain interval (`window_s / limit`) after its last attempt: an address that keeps
  hammering stays shut, and the retry-after it was told is never shorter than the truth;
- a key id over its limit answers its *failed* attempts with 429 instead of 401, while the
  right secret still passes: knowing a key id (it is not secret) must not let anyone lock its
  owner out.

State is per auth replica (no Redis round trip on the hot path): with R replicas behind the
edge an address gets at most R x `limit` failures a window. Each table keeps at most
`max_tracked` entries, least recently failed evicted first, so memory stays bounded whatever
an attacker rotates through.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ThrottleSettings:
    """AUTH_FAILED_AUTH_LIMIT failures per AUTH_FAILED_AUTH_WINDOW_S; limit 0 = off."""

    limit: int = 20
    window_s: float = 60.0
    max_tracked: int = 100_000

    @property
    def enabled(self) -> bool:
        return self.limit > 0


@dataclass(slots=True)
class _Level:
    value: float
    at: float  # monotonic seconds of the last update


@dataclass
class LeakyCounters:
    """Failure levels by key, draining at `limit / window_s` per second, at most `max_tracked`."""

    settings: ThrottleSettings
    clock: Callable[[], float] = time.monotonic
    _levels: OrderedDict[str, _Level] = field(default_factory=OrderedDict)

    def __len__(self) -> int:
        return len(self._levels)

    def wait_s(self, key: str) -> float:
        """Seconds until `key` is under its limit again (0: it is under it now)."""
        entry = self._levels.get(key)
        if entry is None:
            return 0.0
        level = self._drained(entry, self.clock())
        excess = level - self.settings.limit + 1
        return 0.0 if excess <= 0 else excess / self._rate

    def add(self, key: str) -> None:
        """One more failure for `key`."""
        self._update(key, lambda level: level + 1.0)

    def hold(self, key: str) -> None:
        """`key` was refused: its level back up to the limit (one more drain interval)."""
        self._update(key, lambda level: max(level, float(self.settings.limit)))

    def _update(self, key: str, change: Callable[[float], float]) -> None:
        now = self.clock()
        entry = self._levels.pop(key, None)
        level = 0.0 if entry is None else self._drained(entry, now)
        if len(self._levels) >= self.settings.max_tracked:
            self._levels.popitem(last=False)  # the least recently failed
        self._levels[key] = _Level(change(level), now)

    @property
    def _rate(self) -> float:
        return self.settings.limit / self.settings.window_s

    def _drained(self, entry: _Level, now: float) -> float:
        return max(0.0, entry.value - (now - entry.at) * self._rate)


class FailureThrottle:
    """The two tables: client addresses and key ids."""

    def __init__(
        self, settings: ThrottleSettings, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self.addresses = LeakyCounters(settings, clock)
        self.keys = LeakyCounters(settings, clock)

    def address_wait_s(self, address: str) -> float:
        """How long `address` must wait before its credentials are checked again (0: now).
        A refused address is held at its limit: this request's wait counts from now."""
        if not self.settings.enabled or not address:
            return 0.0
        if self.addresses.wait_s(address) <= 0:
            return 0.0
        self.addresses.hold(address)
        return self.addresses.wait_s(address)

    def failed(self, address: str, key_id: str | None) -> float:
        """Record a failure; the seconds the key id was (already) throttled for, else 0."""
        if not self.settings.enabled:
            return 0.0
        if address:  # unknown: never one shared bucket that would throttle everyone
            self.addresses.add(address)
        if key_id is None:
            return 0.0
        wait = self.keys.wait_s(key_id)
        self.keys.add(key_id)
        return wait


def retry_after_s(wait_s: float) -> float:
    """A whole number of seconds, at least 1 (what retry-after can say)."""
    return float(max(1, math.ceil(wait_s)))
