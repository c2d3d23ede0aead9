"""bench_engine's RSS over many sequential short requests."""

from __future__ import annotations

import gc
import random
import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_config import FIRST_ID
from engine_runs import consume, engine_config, with_engine
from engine_values import Request


@dataclass(frozen=True, slots=True)
class RssPoint:
    """The process's RSS after `requests` requests."""

    requests: int
    rss: int  # bytes


def rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


async def bench_rss(model_dir: Path, total: int, vocab: int) -> dict[str, Any]:
    engine = await with_engine(model_dir, engine_config())
    rng = random.Random(7)
    samples: list[RssPoint] = []
    warmup = total // 10
    try:
        for i in range(total):
            prompt = [rng.randrange(FIRST_ID, vocab) for _ in range(rng.randint(8, 48))]
            await consume(engine, f"rss-{i}", Request(prompt, rng.randint(1, 8)))
            if i + 1 >= warmup and (i + 1) % (total // 20) == 0:
                gc.collect()
                samples.append(RssPoint(i + 1, rss_bytes()))
    finally:
        await engine.stop()
    first, last = samples[0].rss, samples[-1].rss
    peak = max(s.rss for s in samples)
    return {
        "requests": total,
        "warmup_requests": warmup,
        "samples": [{"requests": s.requests, "rss_mib": s.rss / 2**20} for s in samples],
        "rss_first_mib": first / 2**20,
        "rss_last_mib": last / 2**20,
        "drift": (last - first) / first,
        "max_excursion": (peak - first) / first,
    }
