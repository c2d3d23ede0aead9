"""bench_billing's report: per-arm figures, projection to dedicated cores, verdicts."""

from __future__ import annotations

import argparse
import os
import platform
from typing import Any

from billing_config import (
    BATCH_MAX,
    BATCHED_ARM,
    GOAL_CORES,
    GOAL_P99_MS,
    GOAL_SETTLES_PER_S,
    GRPC_ARMS,
    MODEL,
    SETTLE_ONLY_ARM,
    SETTLE_ONLY_CALLS_IN_FLIGHT,
    TENANTS,
)
from billing_measure import summary
from billing_values import Arm, Setup
from billing_verdicts import goal_verdicts


def arm_report(arm: Arm) -> dict[str, Any]:
    pairs = len(arm.pair)
    pairs_per_s = pairs / arm.elapsed_s
    cpu_ms = {name: round(s * 1e3 / pairs, 3) for name, s in arm.cpu_s.items()}
    return {
        "server_processes": arm.server_processes,
        "client_processes": arm.client_processes,
        "pairs_per_s": round(pairs_per_s, 1),
        "settles_per_s": round(pairs_per_s, 1),  # one settle per pair
        "rpcs_per_s": round((pairs + (arm.settle_calls or pairs)) / arm.elapsed_s, 1),
        "settles_per_settle_call": round(pairs / (arm.settle_calls or pairs), 2),
        "pair": summary(arm.pair),
        "reserve": summary(arm.reserve),
        "settle": summary(arm.settle),
        "cpu_ms_per_pair": cpu_ms,
        "cpu_ms_per_pair_total": round(sum(cpu_ms.values()), 3),
        "server_cpu_s_by_process": [round(s, 2) for s in arm.server_cpu_by_process],
    }


def settle_stream_report(arm: Arm, setup: Setup) -> dict[str, Any]:
    """Open-loop settles (or whole requests) through the router's SettleBatcher at a fixed
    offered rate."""
    cpu_ms = {name: round(s * 1e3 / arm.settles, 4) for name, s in arm.cpu_s.items()}
    pairs = (
        # Reserve from when the request was due, its settle from when it was submitted.
        {"reserve": summary(arm.reserve), "pair": summary(arm.pair)} if arm.reserve else {}
    )
    return {
        "server_processes": arm.server_processes,
        "client_processes": arm.client_processes,
        "offered_settles_per_s": setup.rate_per_s,
        "batches_in_flight_before_queueing": setup.in_flight,
        "settles_per_s": round(arm.settles / arm.elapsed_s, 1),
        "settles_per_call": round(arm.settles / max(1, arm.settle_calls), 2),
        # From when each settle was due to its answer: queue wait + SettleBatch call.
        "settle": summary(arm.settle),
        **pairs,
        "cpu_ms_per_settle": cpu_ms,
        "cpu_ms_per_settle_total": round(sum(cpu_ms.values()), 4),
    }


def settle_only_report(arm: Arm) -> dict[str, Any]:
    """Settles of pre-reserved requests, BATCH_MAX per SettleBatch call."""
    cpu_ms = {name: round(s * 1e3 / arm.settles, 4) for name, s in arm.cpu_s.items()}
    return {
        "server_processes": arm.server_processes,
        "client_processes": arm.client_processes,
        "items_per_call": BATCH_MAX,
        "calls_in_flight": SETTLE_ONLY_CALLS_IN_FLIGHT,
        "settles_per_s": round(arm.settles / arm.elapsed_s, 1),
        "batch_call": summary(arm.settle),
        "cpu_ms_per_settle": cpu_ms,
        "cpu_ms_per_settle_total": round(sum(cpu_ms.values()), 4),
        "server_cpu_s_by_process": [round(s, 2) for s in arm.server_cpu_by_process],
    }


def projection(levels: list[dict[str, Any]]) -> dict[str, Any]:
    """Pairs/s the billing processes could sustain on dedicated cores, from CPU per pair,
    for each gRPC set-up at its cheapest level."""
    return {arm: _projection(levels, arm) for arm in (*GRPC_ARMS, BATCHED_ARM)} | {
        SETTLE_ONLY_ARM: _settle_only_projection(levels),
        "note": (
            "One billing process runs on one core. The 2-core figure assumes billing "
            "processes and Redis sharing 2 dedicated cores with the clients elsewhere (for "
            "the 1x1 set-up that needs a second process, at the same CPU per pair); the "
            "with-clients figure also puts the gRPC clients on those 2 cores."
        ),
    }


def _settle_only_projection(levels: list[dict[str, Any]]) -> dict[str, Any]:
    best = min(levels, key=lambda lv: lv[SETTLE_ONLY_ARM]["cpu_ms_per_settle"]["billing_server"])
    cpu = best[SETTLE_ONLY_ARM]["cpu_ms_per_settle"]
    server_ms, redis_ms = cpu["billing_server"], cpu["redis"]
    return {
        "concurrency": best["concurrency"],
        "server_cpu_ms_per_settle": server_ms,
        "redis_cpu_ms_per_settle": redis_ms,
        "client_cpu_ms_per_settle": cpu["client"],
        "one_process_settles_per_s": round(1000 / server_ms, 1),
        f"{GOAL_CORES}_cores_settles_per_s": round(GOAL_CORES * 1000 / (server_ms + redis_ms), 1),
    }


def _projection(levels: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    best = min(levels, key=lambda lv: lv[arm]["cpu_ms_per_pair"]["billing_server"])
    cpu = best[arm]["cpu_ms_per_pair"]
    server_ms, redis_ms, client_ms = cpu["billing_server"], cpu["redis"], cpu["client"]
    return {
        "concurrency": best["concurrency"],
        "server_cpu_ms_per_pair": server_ms,
        "redis_cpu_ms_per_pair": redis_ms,
        "client_cpu_ms_per_pair": client_ms,
        "one_process_pairs_per_s": round(1000 / server_ms, 1),  # one event loop = one core
        f"{GOAL_CORES}_cores_pairs_per_s": round(GOAL_CORES * 1000 / (server_ms + redis_ms), 1),
        f"{GOAL_CORES}_cores_with_clients_pairs_per_s": round(
            GOAL_CORES * 1000 / (server_ms + redis_ms + client_ms), 1
        ),
    }


def report(
    args: argparse.Namespace,
    redis_url: str,
    levels: list[dict[str, Any]],
    checked: dict[str, int],
) -> dict[str, Any]:
    verdicts = goal_verdicts(levels)
    return {
        "benchmark": "billing Reserve+Settle pairs",
        "what": (
            "Each pair is Reserve then Settle of one request (idempotent Lua scripts on Redis). "
            "`grpc` goes through `python -m llm_billing` with BILLING_WORKERS server processes "
            "on one port, driven by several client processes (each with several connections); "
            "`grpc_baseline_1x1` is one server process and one client process on one "
            "connection; both use the standard interceptors (tracing, request id, deadline, "
            "access log + metrics, errors). `direct_in_process` calls the same Ledger methods "
            "in the benchmark process. The arms alternate in rounds in the same run against "
            "the same Redis; client CPU is on the same machine and reported."
        ),
        "goal": {
            "settles_per_s": GOAL_SETTLES_PER_S,
            "settle_p99_ms": GOAL_P99_MS,
            "cores": GOAL_CORES,
            # One verdict per metric, measured on this (shared) machine; `met_by` names the
            # metrics that meet both thresholds.
            "verdicts": verdicts,
            "met_by": [v["metric"] for v in verdicts if v["met_measured"]],
        },
        "projection": projection(levels),
        "levels": levels,
        "ledger_check": checked,
        "setup": {
            "pairs_per_level": args.pairs,
            "concurrency": args.concurrency,
            "server_processes": args.workers,
            "client_processes": args.clients,
            "channels_per_client": args.channels,
            "tenants": TENANTS,
            "model": MODEL,
            "redis": redis_url.split("@")[-1],
            "cpus": os.cpu_count(),
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
    }
