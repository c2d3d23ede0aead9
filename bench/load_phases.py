"""bench_load's phases: load steps up to the knee, then the soak; results written as they end."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import platform
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from load_analysis import knee, saturation, summarize, sustained
from load_client import Client, open_loop
from load_config import (
    BACKLOG_GROWTH,
    BACKLOG_SLACK,
    MAX_ERROR_RATE,
    MODEL,
    OUTPUT_MIX,
    PROMPT_MIX,
    SOAK_SHARE,
    SUSTAINED_SHARE,
    Options,
)
from load_plot import plot
from load_rss import Sampler, rss_growth

from llm_stack.stack import Stack


def schedule(opts: Options) -> Iterator[float]:
    """The given rates, then x1.5 steps up to --max-rate until the knee is found."""
    yield from opts.rates
    rate = opts.rates[-1] * 1.5
    while rate <= opts.max_rate:
        yield round(rate, 2)
        rate *= 1.5


async def steps(client: Client, opts: Options) -> list[dict[str, Any]]:
    rng = random.Random(opts.seed)
    results: list[dict[str, Any]] = []
    for rate in schedule(opts):
        outcomes = await open_loop(client, rng, rate, opts.step_s)
        step = summarize(outcomes, rate, opts.step_s, opts)
        results.append(step)
        shown = ("offered_rps", "goodput_rps", "error_rate", "ttft_ms", "e2e_ms", "loadavg")
        print(json.dumps({k: step[k] for k in shown}), flush=True)
        if knee(results) is not None:
            break
    return results


async def soak(client: Client, sampler: Sampler, rate: float, opts: Options) -> dict[str, Any]:
    stop = asyncio.Event()

    async def sample() -> None:
        start = time.monotonic()
        while not stop.is_set():
            sampler.sample(time.monotonic() - start)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), opts.rss_interval_s)

    sampling = asyncio.create_task(sample())
    outcomes = await open_loop(client, random.Random(opts.seed + 1), rate, opts.soak_s)
    stop.set()
    await sampling
    summary = summarize(outcomes, rate, opts.soak_s, opts)
    # RSS growth under overload is mostly queued work: say whether the soak kept up
    return {**summary, "sustained": sustained(summary), "rss": rss_growth(sampler, opts.soak_s)}


def update_results(path: Path, entries: dict[str, Any]) -> None:
    """Read-modify-write of the shared results file under a lock, replaced atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            current = json.loads(path.read_text())
        except (OSError, ValueError):
            current = {}
        if not isinstance(current, dict):
            current = {}
        current.update(entries)
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(current, indent=2) + "\n")
        os.replace(temporary, path)


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def workload(opts: Options) -> dict[str, Any]:
    return {
        "model": MODEL,
        "rpc": "LLMService.ChatStream through the edge (gRPC), response cache bypassed",
        "prompt_words_mix": PROMPT_MIX,
        "max_tokens_mix": OUTPUT_MIX,
        "sampling": "temperature 0.8, seeded, ignore_eos",
        "slo": {"ttft_ms": opts.slo_ttft_ms, "tpot_ms": opts.slo_tpot_ms},
        "latency_from": "scheduled arrival time",
        "seed": opts.seed,
    }


async def measure(stack: Stack, key: str, opts: Options, replicas: int) -> None:
    client = Client(stack.endpoints.edge_http, key, opts.timeout_s)
    try:
        load = await load_phase(client, opts, replicas)
        if opts.soak_s > 0:
            base = load["saturation_rps"] or min(opts.rates)
            pids = {p.spec.name: p.pid for p in stack.processes() if p.pid is not None}
            await soak_phase(client, Sampler(pids), load, round(SOAK_SHARE * base, 3), opts)
    finally:
        await client.close()


async def load_phase(client: Client, opts: Options, replicas: int) -> dict[str, Any]:
    warm = await open_loop(client, random.Random(opts.seed + 2), 1.0, 5.0)
    results = await steps(client, opts)
    load = {
        "benchmark": "load",
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "generation_replicas": replicas,
        "workload": workload(opts),
        "warmup_requests": len(warm),
        "step_s": opts.step_s,
        "steps": results,
        **saturation(results),
        "sustained_rule": f"slo_attainment >= {SUSTAINED_SHARE}, errors <= {MAX_ERROR_RATE}, "
        f"in-flight in the last quarter <= {BACKLOG_GROWTH} x the second quarter + {BACKLOG_SLACK}",
        "saturation_rule": "highest sustained rate below the first two unsustained steps",
    }
    update_results(opts.out, {"load": load})
    plot(load, None, opts.out.parent / "load.png")
    return load


async def soak_phase(
    client: Client, sampler: Sampler, load: dict[str, Any], rate: float, opts: Options
) -> None:
    result = await soak(client, sampler, rate, opts)
    soaked = {
        "benchmark": "soak",
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": machine(),
        "share_of_saturation": SOAK_SHARE,
        "duration_s": opts.soak_s,
        "rss_interval_s": opts.rss_interval_s,
        **result,
    }
    update_results(opts.out, {"soak": soaked})
    plot(load, soaked, opts.out.parent / "load.png")
    rss = soaked["rss"]
    summary = {"soak_rps": rate, "error_rate": soaked["error_rate"], **rss}
    print(json.dumps({k: summary[k] for k in ("soak_rps", "error_rate", "max_growth_pct", "met")}))
