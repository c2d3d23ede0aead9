"""Billing benchmark: Reserve+Settle pairs through gRPC (a `python -m llm_billing` process)
against the same Ledger calls made in-process, both on the real Redis, in one run
-> bench/results/billing.json and billing.png.

Run from the repository root: `.venv/bin/python bench/bench_billing.py`.
Goal (issue 6): >= 2,000 settles/s on 2 cores with p99 <= 5 ms.

Besides wall-clock throughput and latency, it records the CPU time each pair costs in the
billing process, the benchmark client and Redis, so the result can be read on a machine
shared with other work: capacity on N dedicated cores is about N / (CPU seconds per pair).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import redis.asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from llm_billing.budgets import BudgetLimits
from llm_billing.config import LedgerSettings, RedisSettings, Settings
from llm_billing.ledger import ReserveInput, SettleInput, Usage
from llm_billing.metrics import BillingMetrics
from llm_billing.prices import load_prices
from llm_billing.server import Billing, build_billing
from llm_billing.timeutil import Period
from llm_billing.usage import Granularity, UsageQuery
from llm_common.testing import free_port, redis_url_for_tests, settings_for_tests
from llmapi.billing.v1 import billing_service_pb2 as pb
from llmapi.billing.v1 import billing_service_pb2_grpc as pb_grpc
from llmapi.common.v1 import common_pb2

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PRICES = ROOT / "infra" / "config" / "prices.yaml"
MODEL = "demo-llama"
TENANTS = 16
GOAL_SETTLES_PER_S = 2000.0
GOAL_P99_MS = 5.0
GOAL_CORES = 2
ROUNDS = 4  # gRPC and in-process alternate, so drift in machine load hits both alike
STOP = common_pb2.FINISH_REASON_STOP

Pair = Callable[[str, str], Awaitable[tuple[float, float]]]


@dataclass
class Arm:
    """Latencies (ms), wall time and CPU seconds (by process) of one arm."""

    reserve: list[float] = field(default_factory=list)
    settle: list[float] = field(default_factory=list)
    pair: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)


class CpuMeters:
    """CPU seconds used so far by the client (this process), the billing process and Redis
    (INFO cpu: a shared Redis also counts other clients' work, so it is an upper bound)."""

    def __init__(self, client: redis.asyncio.Redis, server_pid: int | None) -> None:
        self._redis = client
        self._server_pid = server_pid

    async def read(self) -> dict[str, float]:
        info = await self._redis.info("cpu")
        readings = {
            "client": time.process_time(),
            "redis": float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
        }
        if self._server_pid is not None:
            readings["billing_server"] = _process_cpu_s(self._server_pid)
        return readings


def _process_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def arm_report(arm: Arm) -> dict[str, Any]:
    pairs = len(arm.pair)
    pairs_per_s = pairs / arm.elapsed_s
    cpu_ms = {name: round(s * 1e3 / pairs, 3) for name, s in arm.cpu_s.items()}
    return {
        "pairs_per_s": round(pairs_per_s, 1),
        "settles_per_s": round(pairs_per_s, 1),  # one Settle per pair
        "rpcs_per_s": round(2 * pairs_per_s, 1),
        "pair": summary(arm.pair),
        "reserve": summary(arm.reserve),
        "settle": summary(arm.settle),
        "cpu_ms_per_pair": cpu_ms,
    }


async def run_arm(
    pair: Pair, meters: CpuMeters, prefix: str, count: int, concurrency: int, into: Arm
) -> None:
    """`count` pairs from `concurrency` workers; request ids are unique per call."""
    next_index = iter(range(count))

    async def worker(w: int) -> None:
        tenant = f"bench{w % TENANTS}"
        for i in next_index:
            start = time.perf_counter()
            reserve_s, settle_s = await pair(f"{prefix}-{i}", tenant)
            into.pair.append((time.perf_counter() - start) * 1e3)
            into.reserve.append(reserve_s * 1e3)
            into.settle.append(settle_s * 1e3)

    before = await meters.read()
    start = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    into.elapsed_s += time.perf_counter() - start
    after = await meters.read()
    for name, value in after.items():
        into.cpu_s[name] = into.cpu_s.get(name, 0.0) + value - before[name]


def grpc_pair(stub: pb_grpc.BillingServiceAsyncStub) -> Pair:
    async def pair(rid: str, tenant: str) -> tuple[float, float]:
        t0 = time.perf_counter()
        await stub.Reserve(
            pb.ReserveRequest(
                request_id=rid,
                tenant_id=tenant,
                key_id="key1",
                model=MODEL,
                prompt_tokens=700,
                max_completion_tokens=256,
            ),
            timeout=10,
        )
        t1 = time.perf_counter()
        await stub.Settle(
            pb.SettleRequest(
                request_id=rid,
                tenant_id=tenant,  # what the router sends: no owner lookup needed
                prompt_tokens=700,
                completion_tokens=180,
                cached_tokens=128,
                finish_reason=STOP,
            ),
            timeout=10,
        )
        return t1 - t0, time.perf_counter() - t1

    return pair


def direct_pair(billing: Billing) -> Pair:
    async def pair(rid: str, tenant: str) -> tuple[float, float]:
        t0 = time.perf_counter()
        await billing.ledger.reserve(ReserveInput(rid, tenant, "key1", MODEL, 700, 256))
        t1 = time.perf_counter()
        await billing.ledger.settle(SettleInput(rid, tenant, Usage(700, 180, 128, STOP)))
        return t1 - t0, time.perf_counter() - t1

    return pair


@contextlib.asynccontextmanager
async def billing_process(
    env: dict[str, str], port: int
) -> AsyncIterator[tuple[grpc.aio.Channel, int]]:
    """`python -m llm_billing` as its own process (its own core, as in production)."""
    process = subprocess.Popen(  # noqa: ASYNC220 - started once, before measuring
        [sys.executable, "-m", "llm_billing"], env=env, cwd=ROOT
    )
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=60, wait_for_ready=True
        )
        yield channel, process.pid
    finally:
        await channel.close()
        process.terminate()
        process.wait(timeout=30)


async def set_budgets(billing: Billing) -> None:
    # Every Reserve checks a tenant budget, as it would in production.
    for t in range(TENANTS):
        await billing.budgets.set(BudgetLimits(f"bench{t}", "", Period.MONTH, 10**15, 10**14))


async def delete_prefix(client: redis.asyncio.Redis, prefix: str) -> int:
    keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]
    for start in range(0, len(keys), 1000):
        await client.delete(*keys[start : start + 1000])
    return len(keys)


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    redis_url = args.redis_url or redis_url_for_tests()
    prefix = f"bench:{uuid.uuid4().hex}:billing:"
    settings = Settings(
        server=settings_for_tests("billing"),
        redis=RedisSettings(redis_url),
        prices_config=PRICES,
        ledger=LedgerSettings(key_prefix=prefix),
    )
    billing = build_billing(
        settings, load_prices(PRICES, "USD"), metrics=BillingMetrics(CollectorRegistry())
    )
    port = free_port()
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "BILLING_KEY_PREFIX": prefix,
        "PRICES_CONFIG": str(PRICES),
        "GRPC_PORT": str(port),
        "METRICS_PORT": "off",
        "LOG_LEVEL": "WARNING",
    }
    levels, pairs_run = [], 0
    try:
        await set_budgets(billing)
        async with billing_process(env, port) as (channel, pid):
            meters = CpuMeters(billing.client, pid)
            arms = (grpc_pair(pb_grpc.BillingServiceStub(channel)), direct_pair(billing))
            for name, pair in zip(("warm-g", "warm-d"), arms, strict=True):
                await run_arm(pair, meters, name, args.warmup, 8, Arm())
            for concurrency in args.concurrency:
                levels.append(await compare(arms, meters, concurrency, args.pairs))
                print(json.dumps(levels[-1]["summary"]), file=sys.stderr)
            pairs_run = 2 * (args.warmup + args.pairs // ROUNDS * ROUNDS * len(args.concurrency))
            ledger_requests = await count_ledger(billing)
    finally:
        await delete_prefix(billing.client, prefix)
        await billing.client.aclose()
    checked = {"ledger_requests": ledger_requests, "pairs_run": pairs_run}
    return report(args, redis_url, levels, checked)


async def compare(
    arms: tuple[Pair, Pair], meters: CpuMeters, concurrency: int, pairs: int
) -> dict[str, Any]:
    via_grpc, direct = arms
    g, d = Arm(), Arm()
    per_round = pairs // ROUNDS
    for r in range(ROUNDS):
        await run_arm(via_grpc, meters, f"g{concurrency}-{r}", per_round, concurrency, g)
        await run_arm(direct, meters, f"d{concurrency}-{r}", per_round, concurrency, d)
    grpc_report, direct_report = arm_report(g), arm_report(d)
    server_cpu = grpc_report["cpu_ms_per_pair"]["billing_server"]
    redis_cpu = grpc_report["cpu_ms_per_pair"]["redis"]
    return {
        "concurrency": concurrency,
        "grpc": grpc_report,
        "direct_in_process": direct_report,
        "grpc_added_p50_ms": round(
            grpc_report["pair"]["p50_ms"] - direct_report["pair"]["p50_ms"], 3
        ),
        "summary": {
            "concurrency": concurrency,
            "grpc_settles_per_s": grpc_report["settles_per_s"],
            "grpc_settle_p50_ms": grpc_report["settle"]["p50_ms"],
            "grpc_settle_p99_ms": grpc_report["settle"]["p99_ms"],
            "direct_settles_per_s": direct_report["settles_per_s"],
            "direct_settle_p99_ms": direct_report["settle"]["p99_ms"],
            "server_cpu_ms_per_pair": server_cpu,
            "redis_cpu_ms_per_pair": redis_cpu,
        },
    }


async def count_ledger(billing: Billing) -> int:
    """Requests in the ledger: every pair run (warm-up included) must be there exactly once."""
    now = time.time_ns() // 1_000_000
    requests = 0
    for t in range(TENANTS):
        report = await billing.usage.usage(
            UsageQuery(f"bench{t}", "", "", now - 7_200_000, now + 7_200_000, Granularity.TOTAL)
        )
        requests += report.total.requests
    return requests


def projection(levels: list[dict[str, Any]]) -> dict[str, Any]:
    """Pairs/s the billing process could sustain on dedicated cores, from CPU per pair."""
    best = min(levels, key=lambda lv: lv["grpc"]["cpu_ms_per_pair"]["billing_server"])
    server_ms = best["grpc"]["cpu_ms_per_pair"]["billing_server"]
    redis_ms = best["grpc"]["cpu_ms_per_pair"]["redis"]
    return {
        "server_cpu_ms_per_pair": server_ms,
        "redis_cpu_ms_per_pair": redis_ms,
        "one_process_pairs_per_s": round(1000 / server_ms, 1),  # one event loop = one core
        f"{GOAL_CORES}_cores_pairs_per_s": round(GOAL_CORES * 1000 / (server_ms + redis_ms), 1),
        "note": (
            "One billing process runs on one core; the 2-core figure assumes two billing "
            "processes (replicas) and Redis sharing 2 dedicated cores, the client elsewhere."
        ),
    }


def report(
    args: argparse.Namespace,
    redis_url: str,
    levels: list[dict[str, Any]],
    checked: dict[str, int],
) -> dict[str, Any]:
    best = max(levels, key=lambda level: level["grpc"]["settles_per_s"])
    return {
        "benchmark": "billing Reserve+Settle pairs",
        "what": (
            "Each pair is Reserve then Settle of one request (idempotent Lua scripts on Redis). "
            "`grpc` goes through a separate `python -m llm_billing` process with the standard "
            "interceptors (tracing, request id, deadline, access log + metrics, errors); "
            "`direct_in_process` calls the same Ledger methods in the benchmark process. Both "
            "arms alternate in rounds in the same run against the same Redis."
        ),
        "goal": {
            "settles_per_s": GOAL_SETTLES_PER_S,
            "settle_p99_ms": GOAL_P99_MS,
            "cores": GOAL_CORES,
            "met_measured": best["grpc"]["settles_per_s"] >= GOAL_SETTLES_PER_S
            and best["grpc"]["settle"]["p99_ms"] <= GOAL_P99_MS,
        },
        "projection": projection(levels),
        "levels": levels,
        "ledger_check": checked,
        "setup": {
            "pairs_per_level": args.pairs,
            "concurrency": args.concurrency,
            "tenants": TENANTS,
            "model": MODEL,
            "redis": redis_url.split("@")[-1],
            "cpus": os.cpu_count(),
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = result["levels"]
    labels = [str(level["concurrency"]) for level in levels]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    width, xs = 0.38, range(len(levels))
    arms = ((-width / 2, "grpc", "gRPC"), (width / 2, "direct_in_process", "in-process"))
    for offset, arm, name in arms:
        at = [x + offset for x in xs]
        left.bar(at, [lv[arm]["settles_per_s"] for lv in levels], width, label=name)
        right.bar(at, [lv[arm]["settle"]["p99_ms"] for lv in levels], width, label=name)
    left.axhline(GOAL_SETTLES_PER_S, color="red", linestyle="--", label="goal")
    right.axhline(GOAL_P99_MS, color="red", linestyle="--", label="goal")
    left.set(title="Settles per second", xlabel="concurrency", xticks=list(xs), xticklabels=labels)
    right.set(title="Settle p99 (ms)", xlabel="concurrency", xticks=list(xs), xticklabels=labels)
    left.legend()
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=4000, help="measured pairs per level and arm")
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--redis-url", default=None, help="default: REDIS_URL or local Redis")
    parser.add_argument("--out", type=Path, default=RESULTS / "billing.json")
    args = parser.parse_args()
    result = asyncio.run(bench(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    plot(result, args.out.with_suffix(".png"))
    levels = [level["summary"] for level in result["levels"]]
    print(
        json.dumps(
            {"goal": result["goal"], "projection": result["projection"], "levels": levels}, indent=2
        )
    )


if __name__ == "__main__":
    main()
