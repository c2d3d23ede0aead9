"""bench_billing's measures: CPU seconds by process and of Redis, latency summaries."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

import redis.asyncio


def _process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu_s(pid: int) -> dict[int, float]:
    """CPU by process of a billing server: its BILLING_WORKERS workers, else itself."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    workers = [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
    return {p: _process_cpu_s(p) for p in [pid, *workers]}


async def redis_cpu_s(client: redis.asyncio.Redis) -> float:
    """INFO cpu: a shared Redis also counts other clients' work, so an upper bound."""
    info = await client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(samples_ms: list[float]) -> dict[str, float]:
    return {
        "n": len(samples_ms),
        "p50_ms": round(percentile(samples_ms, 50), 3),
        "p90_ms": round(percentile(samples_ms, 90), 3),
        "p99_ms": round(percentile(samples_ms, 99), 3),
        "mean_ms": round(statistics.fmean(samples_ms), 3),
    }
