"""Billing benchmark: Reserve+Settle pairs through gRPC against `python -m llm_billing`, in
one run: the scaled set-up (BILLING_WORKERS server processes on one port, several client
processes) against the single-process baseline (one server process, one client process) and
the same Ledger calls made in-process, all on the real Redis; and, on the single-process
set-up, settles coalesced into SettleBatch calls as the router sends them (Reserve unary,
settles queued by llm_router's SettleBatcher), settle-only SettleBatch throughput of
pre-reserved requests, an open-loop stream of settles through the SettleBatcher at two
offered rates, the goal + 5% and the goal + 25% (latency counted from when each was due), and
an open loop of whole requests at the goal + 5% (each one's Reserve, then its settle through
the SettleBatcher, as the router meets them under load) -> bench/results/billing.json and
billing.png.

Run from the repository root: `.venv/bin/python bench/bench_billing.py`.
Goal (issue 6): >= 2,000 settles/s on 2 cores with p99 <= 5 ms.

Besides wall-clock throughput and latency, it records the CPU time each pair costs in the
billing processes, the benchmark clients and Redis, so the result can be read on a machine
shared with other work: capacity on N dedicated cores is about N / (CPU seconds per pair).
The clients run on the same cores as the servers: their CPU is reported, not hidden.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any

import machine
from billing_clients import Clients
from billing_config import (
    BATCHED_ARM,
    GOAL_P99_MS,
    GOAL_STREAM_ARM,
    GOAL_STREAM_RATE_PER_S,
    PAIR_STREAM_ARM,
    PAIR_STREAM_UNARY_ARM,
    PRE_RESERVED,
    PRICES,
    RESULTS,
    ROUNDS,
    SETTLE_ONLY_ARM,
    STREAM_ARM,
    STREAM_RATE_PER_S,
    STREAM_TIMER_ARM,
)
from billing_level import level_report
from billing_plot import plot
from billing_report import report
from billing_rounds import (
    billing_process,
    count_ledger,
    delete_prefix,
    reserve_ahead,
    run_direct_round,
    run_grpc_round,
    set_budgets,
)
from billing_values import Arm, Setup
from prometheus_client import CollectorRegistry

from llm_billing.config import LedgerSettings, RedisSettings, Settings
from llm_billing.metrics import BillingMetrics
from llm_billing.prices import load_prices
from llm_billing.server import Billing, build_billing
from llm_common.grpc_runtime import with_grpc_runtime
from llm_testing import redis_url_for_tests, settings_for_tests


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
    env = {
        **with_grpc_runtime(os.environ),
        "REDIS_URL": redis_url,
        "BILLING_KEY_PREFIX": prefix,
        "PRICES_CONFIG": str(PRICES),
        "METRICS_PORT": "off",
        "LOG_LEVEL": "WARNING",
    }
    clients = Clients(args.clients)
    levels, pairs_run = [], 0
    try:
        await set_budgets(billing)
        async with (
            billing_process(env, 1) as single,
            billing_process(env, args.workers) as scaled,
        ):
            setups = (
                Setup("baseline_1x1", single, 1, 1),
                Setup("scaled", scaled, args.clients, args.channels),
                Setup(BATCHED_ARM, single, 1, 1, mode="batched"),
                Setup(SETTLE_ONLY_ARM, single, 1, 1, mode="settle_only"),
                Setup(STREAM_ARM, single, 1, 1, "settle_stream", args.settle_rate),
                Setup(GOAL_STREAM_ARM, single, 1, 1, "settle_stream", GOAL_STREAM_RATE_PER_S),
                Setup(STREAM_TIMER_ARM, single, 1, 1, "settle_stream", args.settle_rate, 0),
                Setup(PAIR_STREAM_ARM, single, 1, 1, "pair_stream", GOAL_STREAM_RATE_PER_S),
                Setup(
                    PAIR_STREAM_UNARY_ARM, single, 1, 1, "pair_stream_unary", GOAL_STREAM_RATE_PER_S
                ),
            )
            for setup in setups:
                warm = Arm(setup.server.workers, setup.client_processes)
                if setup.mode in PRE_RESERVED:
                    await reserve_ahead(billing, f"w{setup.name}", args.warmup)
                await run_grpc_round(
                    setup, clients, billing.client, f"w{setup.name}", args.warmup, 8, warm
                )
            await run_direct_round(billing, "wd", args.warmup, 8, Arm(0, 1))
            for concurrency in args.concurrency:
                levels.append(await compare(setups, clients, billing, concurrency, args.pairs))
                print(json.dumps(levels[-1]["summary"]), file=sys.stderr)
            measured = args.pairs // ROUNDS * ROUNDS * len(args.concurrency)
            pairs_run = (len(setups) + 1) * (args.warmup + measured)  # + direct
            ledger_requests = await count_ledger(billing)
    finally:
        clients.close()
        await delete_prefix(billing.client, prefix)
        await billing.aclose()
    checked = {"ledger_requests": ledger_requests, "pairs_run": pairs_run}
    return report(args, redis_url, levels, checked)


async def compare(
    setups: tuple[Setup, ...], clients: Clients, billing: Billing, concurrency: int, pairs: int
) -> dict[str, Any]:
    arms = {s.name: Arm(s.server.workers, s.client_processes) for s in setups}
    direct = Arm(0, 1)
    per_round = pairs // ROUNDS
    for r in range(ROUNDS):
        for s in setups:
            tag = f"{s.name}{concurrency}-{r}"
            if s.mode in PRE_RESERVED:
                await reserve_ahead(billing, tag, per_round)
            await run_grpc_round(
                s, clients, billing.client, tag, per_round, concurrency, arms[s.name]
            )
        await run_direct_round(billing, f"d{concurrency}-{r}", per_round, concurrency, direct)
    return level_report(concurrency, setups, arms, direct)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=4000, help="measured pairs per level and arm")
    parser.add_argument("--warmup", type=int, default=300)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--workers", type=int, default=2, help="billing server processes")
    parser.add_argument("--clients", type=int, default=2, help="benchmark client processes")
    parser.add_argument("--channels", type=int, default=4, help="connections per client")
    parser.add_argument(
        "--settle-rate",
        type=float,
        default=STREAM_RATE_PER_S,
        help="open-loop settles/s of the headroom stream (the goal-rate stream is fixed)",
    )
    parser.add_argument("--redis-url", default=None, help="default: REDIS_URL or local Redis")
    parser.add_argument("--out", type=Path, default=RESULTS / "billing.json")
    args = parser.parse_args()
    watch = machine.Run()
    result = asyncio.run(bench(args))
    result["setup"] |= watch.report()
    # Every settle crosses at least one gRPC hop: its p99 on this machine, idle, is a floor.
    result["goal"]["machine_floor"] = machine.floor_note(
        GOAL_P99_MS,
        watch.probe["grpc_unary"]["p99_ms"],
        "p99 of a bare grpc.aio unary call, concurrency 1, before the run (bench/machine.py)",
    )
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
