"""bench_engine's shared-prefix TTFT, with and without prefix caching."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_runs import engine_config, run_burst, run_sequential, with_engine
from engine_values import Request, RunResult, summarize_run


@dataclass(frozen=True, slots=True)
class PrefixRun:
    """One run's result and the engine's prefix-cache hit rate after it."""

    result: RunResult
    hit_rate: float


async def _prefix_run(
    model_dir: Path, requests: Sequence[Request], caching: bool, mode: str
) -> PrefixRun:
    """One fresh engine (empty cache) per run: the shared system prompt is computed once."""
    engine = await with_engine(model_dir, engine_config(caching))
    try:
        run_mode = run_burst if mode == "burst" else run_sequential
        result = await run_mode(engine, requests, mode)
        return PrefixRun(result, engine.load().prefix_cache_hit_rate)
    finally:
        await engine.stop()


async def bench_prefix(model_dir: Path, requests: Sequence[Request], rounds: int) -> dict[str, Any]:
    """Mean TTFT with and without prefix caching, burst and sequential; median of rounds."""
    results: dict[str, Any] = {"with_cache": {}, "without_cache": {}, "rounds": rounds}
    for mode in ("burst", "sequential"):
        samples: dict[bool, list[PrefixRun]] = {True: [], False: []}
        for _ in range(rounds):
            for caching in (True, False):
                samples[caching].append(await _prefix_run(model_dir, requests, caching, mode))
        for caching, runs in samples.items():
            runs.sort(key=lambda run: statistics.fmean(run.result.ttft_ms))
            median = runs[len(runs) // 2]
            key = "with_cache" if caching else "without_cache"
            results[key][mode] = {
                **summarize_run(median.result),
                "prefix_cache_hit_rate": median.hit_rate,
                "rounds_mean_ttft_ms": [statistics.fmean(r.result.ttft_ms) for r in runs],
            }
        with_cache = results["with_cache"][mode]["mean_ttft_ms"]
        without = results["without_cache"][mode]["mean_ttft_ms"]
        results[f"{mode}_ttft_ratio"] = without / with_cache
    return results
