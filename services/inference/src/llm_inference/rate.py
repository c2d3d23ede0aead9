"""A sliding-window event rate (tokens per second) for load reports."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable


class RateMeter:
    """Counts added over the last `window_s` seconds, divided by the window."""

    def __init__(self, window_s: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._window_s = window_s
        self._clock = clock
        self._events: collections.deque[tuple[float, int]] = collections.deque()
        self._total = 0

    def add(self, count: int) -> None:
        if count > 0:
            now = self._clock()
            self._events.append((now, count))
            self._total += count
            self._expire(now)

    def rate(self) -> float:
        self._expire(self._clock())
        return self._total / self._window_s

    def _expire(self, now: float) -> None:
        while self._events and self._events[0][0] <= now - self._window_s:
            self._total -= self._events.popleft()[1]
