"""`make bench-cluster`: the stateful hot paths on a local 3-master Redis Cluster vs one Redis
(the same redis-server binary, started by this run), then failover under load.

Figures: rate-limit decisions/s (auth's Lua bucket over its pipelined connection), billing
Reserve+Settle pairs/s (the ledger; with WAIT 1 on the cluster, also without), cache exact
lookup p50 (the store's GET_EXACT), each from this one process with many calls in flight; the
share of commands each master served (spread, and whether a global key is a hot slot); the
failover scenario of bench/cluster_failover.py. → bench/results/cluster.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import redis
from cluster_edge_failover import run_edge_failover, start_stack
from cluster_failover import PRICES, run_failover
from prometheus_client import CollectorRegistry

from llm_auth.config import RedisSettings as AuthRedisSettings
from llm_auth.keyspace import Keyspace
from llm_auth.limiter import BucketSpec, Limiter
from llm_auth.redis_guard import RedisGuard, connect
from llm_billing.budgets import BudgetLimits
from llm_billing.config import LedgerSettings, RedisSettings, Settings
from llm_billing.ledger_values import ReserveInput, SettleInput, Usage
from llm_billing.prices import load_prices
from llm_billing.server import build_billing
from llm_billing.timeutil import Period
from llm_cache.canonical import tenant_tag
from llm_cache.changes import PUT, ChangeLog
from llm_cache.config import Policy
from llm_cache.config import RedisSettings as CacheRedisSettings
from llm_cache.metrics import CacheMetrics
from llm_cache.server import redis_client
from llm_cache.store import NewEntry, RedisStore
from llm_common.ports import free_port
from llm_common.resilience import AsyncBreaker, BreakerMetrics
from llm_testing import settings_for_tests
from llm_testing.redis_cluster_local import LocalCluster, server_binary

ROOT = Path(__file__).resolve().parents[1]
OUT = Path(__file__).parent / "results" / "cluster.json"
TENANTS = [f"bench-t{i}" for i in range(64)]
CACHE_PREFIX = "bench:cache:"
IN_FLIGHT = 64
GOAL = 0.8


async def _rate(calls: Callable[[int], Awaitable[Any]], seconds: float) -> float:
    """Calls completed per second with IN_FLIGHT workers for `seconds` (after a warm-up)."""
    for i in range(IN_FLIGHT):
        await calls(i)
    done = 0
    stop_at = time.perf_counter() + seconds

    async def worker(w: int) -> None:
        nonlocal done
        i = w
        while time.perf_counter() < stop_at:
            await calls(i)
            done += 1
            i += IN_FLIGHT

    started = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(IN_FLIGHT)))
    return done / (time.perf_counter() - started)


async def limiter_rate(url: str, seconds: float) -> float:
    settings = AuthRedisSettings(url=url, prefix="bench:auth:", timeout_s=5.0)
    client = connect(settings)
    limiter = Limiter(RedisGuard(client, settings), Keyspace("bench:auth:"))
    bucket = BucketSpec("req:key:k", limit=10**9)
    try:
        return await _rate(lambda i: limiter.hit(TENANTS[i % len(TENANTS)], [bucket], 1), seconds)
    finally:
        await limiter.aclose()
        await client.aclose()


async def billing_rate(url: str, seconds: float, wait_replicas: int, workdir: Path) -> float:
    prices_path = workdir / "prices.yaml"
    prices_path.write_text(PRICES, encoding="utf-8")
    settings = Settings(
        server=settings_for_tests("billing"),
        redis=RedisSettings(url, timeout_s=5.0, wait_replicas=wait_replicas),
        prices_config=prices_path,
        ledger=LedgerSettings(key_prefix=f"bench:billing:{wait_replicas}:"),
    )
    billing = build_billing(settings, load_prices(prices_path, "USD"))
    run = time.time_ns()
    for tenant in TENANTS:
        await billing.budgets.set(BudgetLimits(tenant, "", Period.TOTAL, 10**15, 0))

    async def pair(i: int) -> None:
        tenant, rid = TENANTS[i % len(TENANTS)], f"b{run}-{i}"
        await billing.ledger.reserve(ReserveInput(rid, tenant, "k1", "small", 500, 200))
        await billing.ledger.settle(SettleInput(rid, tenant, Usage(500, 100, 0, 1)))

    try:
        return await _rate(pair, seconds)
    finally:
        await billing.aclose()


def cache_store(url: str) -> tuple[RedisStore, redis.asyncio.Redis]:
    """The cache's store on `url` under the bench prefix (no byte budget to speak of), and
    its client (closed by the caller after the store)."""
    settings = CacheRedisSettings(url=url, key_prefix=CACHE_PREFIX, timeout_s=5.0)
    client = redis_client(settings)
    breaker = AsyncBreaker("bench", fail_max=10**6, metrics=BreakerMetrics(CollectorRegistry()))
    return RedisStore(client, settings, Policy(tenant_budget_bytes=1 << 32), breaker), client


async def cache_p50_ms(url: str, lookups: int) -> float:
    store, client = cache_store(url)
    now = int(time.time() * 1000)
    try:
        for i, tenant in enumerate(TENANTS):
            entry = NewEntry(f"e{i}", "small", "ns", b"x" * 200, now, 3600)
            await store.put(tenant, entry)
        times = []
        for n in range(lookups):
            i = n % len(TENANTS)
            started = time.perf_counter()
            hit = await store.get_exact(TENANTS[i], f"e{i}")
            times.append((time.perf_counter() - started) * 1000)
            assert hit is not None
        return round(statistics.median(times), 4)
    finally:
        await store.aclose()
        await client.aclose()


async def change_log_appends(url: str, masters: list[int]) -> dict[str, float]:
    """Each master's share of the cache's change-log appends when every tenant stores once
    (the log is sharded by tenant so that no master takes them all)."""
    store, client = cache_store(url)
    log = ChangeLog(store, client, CACHE_PREFIX, CacheMetrics(CollectorRegistry()))
    before = {p: _xadds(p) for p in masters}
    try:
        for tenant in TENANTS:
            await log.publish(tenant_tag(tenant), PUT, ["0" * 32])
    finally:
        await store.aclose()
        await client.aclose()
    counts = {p: _xadds(p) - before[p] for p in masters}
    total = sum(counts.values())
    return {str(p): round(n / total, 3) for p, n in counts.items()}


def _xadds(port: int) -> int:
    stats = redis.Redis(port=port, socket_timeout=2).info("commandstats")
    return int(stats.get("cmdstat_xadd", {}).get("calls", 0))


def commands_by_node(ports: list[int]) -> dict[int, int]:
    out = {}
    for port in ports:
        info = redis.Redis(port=port, socket_timeout=2).info("stats")
        out[port] = int(info["total_commands_processed"])
    return out


async def measure(url: str, seconds: float, workdir: Path, *, cluster: bool) -> dict[str, Any]:
    row: dict[str, Any] = {
        "rate_limit_decisions_per_s": round(await limiter_rate(url, seconds)),
        "billing_pairs_per_s": round(await billing_rate(url, seconds, 0, workdir)),
        "cache_exact_p50_ms": await cache_p50_ms(url, 2000),
    }
    if cluster:
        row["billing_pairs_per_s_wait1"] = round(await billing_rate(url, seconds, 1, workdir))
    return row


def start_single(workdir: Path, replica_of: int = 0) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    args = [str(server_binary()), "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
    args += ["--appendonly", "no", "--dir", str(workdir)]
    if replica_of:
        args += ["--replicaof", "127.0.0.1", str(replica_of)]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            if redis.Redis(port=port, socket_timeout=0.2).ping():
                break
        except redis.RedisError:
            time.sleep(0.02)  # a child process starting: no event to await
    return process, f"redis://127.0.0.1:{port}/0"


def edge_failover(workdir: Path) -> dict[str, Any]:
    """The whole platform on a fresh cluster, chats through Envoy while a master dies."""
    with LocalCluster() as cluster:
        stack = start_stack(ROOT, cluster, workdir / "stack")
        endpoints = stack.start()
        try:
            return run_edge_failover(stack, endpoints, cluster).as_dict()
        finally:
            stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per throughput figure")
    parser.add_argument("--skip-failover", action="store_true")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    result: dict[str, Any] = {"binary": str(server_binary()), "in_flight": IN_FLIGHT}
    process, url = start_single(workdir)
    try:
        result["single"] = asyncio.run(measure(url, args.seconds, workdir, cluster=False))
        # The cluster's masters replicate every write (the cache's LRU touch included); one
        # node with a replica shows what replication alone costs a sequential lookup.
        (workdir / "replica").mkdir(exist_ok=True)
        replica, _ = start_single(workdir / "replica", replica_of=int(url.rsplit(":", 1)[1][:-2]))
        time.sleep(1.0)  # the replica's first sync
        result["single"]["cache_exact_p50_ms_with_a_replica"] = asyncio.run(cache_p50_ms(url, 2000))
        replica.kill()
        replica.wait()
    finally:
        process.kill()
        process.wait()
    with LocalCluster() as cluster:
        masters = cluster.master_ports()
        before = commands_by_node(masters)
        result["cluster"] = asyncio.run(measure(cluster.url, args.seconds, workdir, cluster=True))
        after = commands_by_node(masters)
        total = sum(after[p] - before[p] for p in masters)
        result["cluster"]["command_share_by_master"] = {
            str(p): round((after[p] - before[p]) / total, 3) for p in masters
        }
        result["cluster"]["change_log_append_share_by_master"] = asyncio.run(
            change_log_appends(cluster.url, masters)
        )
    single, clustered = result["single"], result["cluster"]

    def ratio(cluster_key: str, single_key: str) -> float:
        return round(float(clustered[cluster_key]) / float(single[single_key]), 3)

    result["ratio_cluster_vs_single"] = {
        "rate_limit_decisions": ratio("rate_limit_decisions_per_s", "rate_limit_decisions_per_s"),
        "billing_pairs": ratio("billing_pairs_per_s", "billing_pairs_per_s"),
        "billing_pairs_wait1": ratio("billing_pairs_per_s_wait1", "billing_pairs_per_s"),
        "cache_exact_p50_speed": round(
            single["cache_exact_p50_ms"] / clustered["cache_exact_p50_ms"], 3
        ),
        "goal": GOAL,
    }
    if not args.skip_failover:
        with LocalCluster() as cluster:
            failover = asyncio.run(run_failover(cluster, workdir))
        result["failover"] = failover.as_dict()
        result["edge_failover"] = edge_failover(workdir)
    shutil.rmtree(workdir, ignore_errors=True)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    json.dump(result, sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
