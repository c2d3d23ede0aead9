"""bench_engine's values: a request, a run's result and its summary."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Request:
    prompt: list[int]
    max_tokens: int


@dataclass(frozen=True, slots=True)
class RunResult:
    output_tokens: int
    seconds: float
    cpu_seconds: float  # process CPU time: less sensitive than wall time to other tenants
    ttft_ms: list[float]

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.output_tokens / self.cpu_seconds


def summarize_run(result: RunResult) -> dict[str, Any]:
    ttft = sorted(result.ttft_ms)
    summary: dict[str, Any] = {
        "output_tokens": result.output_tokens,
        "seconds": result.seconds,
        "cpu_seconds": result.cpu_seconds,
        "output_tokens_per_s": result.tokens_per_s,
        "output_tokens_per_cpu_s": result.tokens_per_cpu_s,
    }
    if ttft:
        summary |= {
            "mean_ttft_ms": statistics.fmean(ttft),
            "p50_ttft_ms": ttft[len(ttft) // 2],
            "p90_ttft_ms": ttft[int(len(ttft) * 0.9)],
            "ttft_ms": ttft,
        }
    return summary
