"""bench_engine's throughput: engine and transformers at each thread count, best vs best."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from engine_baselines import bench_transformers
from engine_runs import bench_throughput
from engine_values import Request, RunResult, summarize_run


def bench_throughput_grid(
    model_dir: Path,
    requests: Sequence[Request],
    thread_counts: Sequence[int],
    hf_batch_sizes: Sequence[int],
    max_engine_runs: int = 3,
) -> dict[str, Any]:
    """Engine and transformers at each thread count; each side is judged at its best setting.

    Engine runs are interleaved with the transformers runs and their median counts (of two, the
    slower), so a burst of load from other tenants of a shared machine does not land on one
    side only. max_engine_runs 2 saves the third run where one run takes minutes.
    """
    engine: dict[int, list[RunResult]] = {}
    hf: dict[tuple[int, int], RunResult] = {}
    for threads in thread_counts:
        torch.set_num_threads(threads)
        runs = [asyncio.run(bench_throughput(model_dir, requests))]
        for batch_size in hf_batch_sizes:
            hf[threads, batch_size] = bench_transformers(model_dir, requests, batch_size)
            runs.append(asyncio.run(bench_throughput(model_dir, requests)))
        if len(runs) % 2 == 0 and len(runs) < max_engine_runs:
            runs.append(asyncio.run(bench_throughput(model_dir, requests)))
        engine[threads] = sorted(runs, key=lambda r: r.tokens_per_s)
    medians = {t: runs[(len(runs) - 1) // 2] for t, runs in engine.items()}
    engine_threads = max(medians, key=lambda t: medians[t].tokens_per_s)
    hf_key = max(hf, key=lambda k: hf[k].tokens_per_s)
    best_engine, best_hf = medians[engine_threads], hf[hf_key]
    return {
        "model": model_dir.name,
        "requests": len(requests),
        "prompt_tokens": sum(len(r.prompt) for r in requests),
        "output_tokens": sum(r.max_tokens for r in requests),
        "engine": {
            f"threads={t}": {**summarize_run(m), "runs_output_tokens_per_s": _rates(engine[t])}
            for t, m in medians.items()
        },
        "transformers": {f"threads={t},batch={b}": summarize_run(r) for (t, b), r in hf.items()},
        "best_engine": {"threads": engine_threads, **summarize_run(best_engine)},
        "best_transformers": {
            "threads": hf_key[0],
            "batch_size": hf_key[1],
            **summarize_run(best_hf),
        },
        "ratio": best_engine.tokens_per_s / best_hf.tokens_per_s,
        # The same comparison in CPU time, which other tenants' load disturbs less.
        "cpu_time_ratio": best_engine.tokens_per_cpu_s / best_hf.tokens_per_cpu_s,
    }


def _rates(runs: Sequence[RunResult]) -> list[float]:
    return [r.tokens_per_s for r in runs]
