"""bench_billing's rounds: the billing server process, one arm's round, ledger set-up and checks."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from itertools import zip_longest

import grpc
import redis.asyncio
from billing_clients import Clients
from billing_config import CHANNEL_OPTIONS, MODEL, ROOT, SETTLE_ONLY_CALLS_IN_FLIGHT, TENANTS
from billing_drivers import direct_pair, drive
from billing_measure import redis_cpu_s, server_cpu_s
from billing_values import Arm, Server, Setup, Work
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llm_billing.budgets import BudgetLimits
from llm_billing.ledger_values import ReserveInput
from llm_billing.server import Billing
from llm_billing.timeutil import Period
from llm_billing.usage import Granularity, UsageQuery
from llm_testing import free_port


@contextlib.asynccontextmanager
async def billing_process(env: dict[str, str], workers: int) -> AsyncIterator[Server]:
    """`python -m llm_billing` with BILLING_WORKERS=`workers`, as in production."""
    port = free_port()
    process = subprocess.Popen(  # noqa: ASYNC220 - started once, before measuring
        [sys.executable, "-m", "llm_billing"],
        env={**env, "GRPC_PORT": str(port), "BILLING_WORKERS": str(workers)},
        cwd=ROOT,
    )
    target = f"127.0.0.1:{port}"
    try:
        for _ in range(4 * workers):  # health from every worker, not just the first one up
            async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
                await health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=60, wait_for_ready=True
                )
        yield Server(target, process.pid, workers)
    finally:
        process.terminate()
        process.wait(timeout=60)


async def run_grpc_round(
    setup: Setup, clients: Clients, redis_client: redis.asyncio.Redis,
    prefix: str, count: int, concurrency: int, into: Arm,
) -> None:  # fmt: skip
    n = setup.client_processes
    if setup.mode == "settle_only":
        concurrency = SETTLE_ONLY_CALLS_IN_FLIGHT
    works = [
        Work(setup.server.target, prefix, i, n, count, max(1, concurrency // n),
             setup.channels_per_client, setup.mode, setup.rate_per_s / n, setup.in_flight)
        for i in range(n)
    ]  # fmt: skip
    server_before, redis_before = server_cpu_s(setup.server.pid), await redis_cpu_s(redis_client)
    results = await clients.run(works)
    server_after = server_cpu_s(setup.server.pid)
    by_process = [server_after[p] - server_before.get(p, 0.0) for p in server_after]
    into.add_cpu("billing_server", sum(by_process))
    # Whether every worker got connections: SO_REUSEPORT spreads them by a hash.
    into.server_cpu_by_process = [
        a + b for a, b in zip_longest(into.server_cpu_by_process, by_process, fillvalue=0.0)
    ]
    into.add_cpu("redis", await redis_cpu_s(redis_client) - redis_before)
    into.add_cpu("client", sum(r["cpu_s"] for r in results))
    into.elapsed_s += max(r["end"] for r in results) - min(r["start"] for r in results)
    for r in results:
        into.reserve += r["reserve"]
        into.settle += r["settle"]
        into.pair += r["pair"]
        into.settles += r.get("settles", len(r["pair"]))
        into.settle_calls += r.get("settle_calls", 0)


async def reserve_ahead(billing: Billing, prefix: str, count: int) -> None:
    """Reserve the requests a settle-only round settles (in-process, before its clock)."""
    ids = iter(range(count))

    async def worker() -> None:
        for i in ids:
            rid, tenant = f"{prefix}-{i}", f"bench{i % TENANTS}"
            await billing.ledger.reserve(ReserveInput(rid, tenant, "key1", MODEL, 700, 256))

    await asyncio.gather(*(worker() for _ in range(32)))


async def run_direct_round(
    billing: Billing, prefix: str, count: int, concurrency: int, into: Arm
) -> None:
    redis_before = await redis_cpu_s(billing.client)
    r = await drive(direct_pair(billing), iter(range(count)), prefix, concurrency)
    into.add_cpu("redis", await redis_cpu_s(billing.client) - redis_before)
    into.add_cpu("client", r["cpu_s"])
    into.elapsed_s += r["end"] - r["start"]
    into.reserve += r["reserve"]
    into.settle += r["settle"]
    into.pair += r["pair"]


async def set_budgets(billing: Billing) -> None:
    # Every Reserve checks a tenant budget, as it would in production.
    for t in range(TENANTS):
        await billing.budgets.set(BudgetLimits(f"bench{t}", "", Period.MONTH, 10**15, 10**14))


async def delete_prefix(client: redis.asyncio.Redis, prefix: str) -> int:
    keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]
    for start in range(0, len(keys), 1000):
        await client.delete(*keys[start : start + 1000])
    return len(keys)


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
