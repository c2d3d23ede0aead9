"""bench_router's latency summary."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stats:
    """Latency summary in milliseconds."""

    n: int
    mean: float
    p50: float
    p99: float

    @classmethod
    def of(cls, samples_s: Sequence[float]) -> Stats:
        ms = sorted(s * 1e3 for s in samples_s)
        return cls(len(ms), statistics.fmean(ms), pct(ms, 0.50), pct(ms, 0.99))


def pct(sorted_ms: Sequence[float], q: float) -> float:
    index = min(len(sorted_ms) - 1, max(0, round(q * (len(sorted_ms) - 1))))
    return round(sorted_ms[index], 3)
