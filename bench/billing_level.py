"""bench_billing's result of one concurrency level: every arm's figures and a summary line."""

from __future__ import annotations

import os
from typing import Any

from billing_config import (
    BATCHED_ARM,
    GOAL_STREAM_ARM,
    PAIR_STREAM_ARM,
    PAIR_STREAM_UNARY_ARM,
    SETTLE_ONLY_ARM,
    STREAM_ARM,
    STREAM_TIMER_ARM,
)
from billing_report import arm_report, settle_only_report, settle_stream_report
from billing_values import Arm, Setup


def level_report(
    concurrency: int, setups: tuple[Setup, ...], arms: dict[str, Arm], direct: Arm
) -> dict[str, Any]:
    """The arms measured at one level (`arms` is consumed)."""
    settle_only = settle_only_report(arms.pop(SETTLE_ONLY_ARM))
    by_name = {s.name: s for s in setups}
    stream = settle_stream_report(arms.pop(STREAM_ARM), by_name[STREAM_ARM])
    at_goal = settle_stream_report(arms.pop(GOAL_STREAM_ARM), by_name[GOAL_STREAM_ARM])
    stream_timer = settle_stream_report(arms.pop(STREAM_TIMER_ARM), by_name[STREAM_TIMER_ARM])
    pair_stream = settle_stream_report(arms.pop(PAIR_STREAM_ARM), by_name[PAIR_STREAM_ARM])
    pair_unary = settle_stream_report(
        arms.pop(PAIR_STREAM_UNARY_ARM), by_name[PAIR_STREAM_UNARY_ARM]
    )
    reports = {name: arm_report(arm) for name, arm in arms.items()}
    scaled, base, batched = reports["scaled"], reports["baseline_1x1"], reports[BATCHED_ARM]
    direct_report = arm_report(direct)
    return {
        "concurrency": concurrency,
        "grpc": scaled,
        "grpc_baseline_1x1": base,
        BATCHED_ARM: batched,
        SETTLE_ONLY_ARM: settle_only,
        STREAM_ARM: stream,
        STREAM_TIMER_ARM: stream_timer,
        GOAL_STREAM_ARM: at_goal,
        PAIR_STREAM_ARM: pair_stream,
        PAIR_STREAM_UNARY_ARM: pair_unary,
        "direct_in_process": direct_report,
        "grpc_added_p50_ms": round(scaled["pair"]["p50_ms"] - direct_report["pair"]["p50_ms"], 3),
        "summary": {
            "concurrency": concurrency,
            "server_processes": scaled["server_processes"],
            "client_processes": scaled["client_processes"],
            "grpc_settles_per_s": scaled["settles_per_s"],
            "grpc_reserve_p99_ms": scaled["reserve"]["p99_ms"],
            "grpc_settle_p50_ms": scaled["settle"]["p50_ms"],
            "grpc_settle_p99_ms": scaled["settle"]["p99_ms"],
            "baseline_1x1_settles_per_s": base["settles_per_s"],
            "baseline_1x1_settle_p99_ms": base["settle"]["p99_ms"],
            "batched_1x1_settles_per_s": batched["settles_per_s"],
            "batched_1x1_reserve_p99_ms": batched["reserve"]["p99_ms"],
            "batched_1x1_settle_p99_ms": batched["settle"]["p99_ms"],
            "batched_1x1_server_cpu_ms_per_pair": batched["cpu_ms_per_pair"]["billing_server"],
            "settle_only_settles_per_s": settle_only["settles_per_s"],
            "settle_only_batch_call_p99_ms": settle_only["batch_call"]["p99_ms"],
            "stream_offered_settles_per_s": stream["offered_settles_per_s"],
            "stream_settles_per_s": stream["settles_per_s"],
            "stream_settle_p50_ms": stream["settle"]["p50_ms"],
            "stream_settle_p99_ms": stream["settle"]["p99_ms"],
            "stream_settles_per_call": stream["settles_per_call"],
            "stream_at_goal_settles_per_s": at_goal["settles_per_s"],
            "stream_at_goal_settle_p99_ms": at_goal["settle"]["p99_ms"],
            "pair_stream_settles_per_s": pair_stream["settles_per_s"],
            "pair_stream_reserve_p99_ms": pair_stream["reserve"]["p99_ms"],
            "pair_stream_settle_p99_ms": pair_stream["settle"]["p99_ms"],
            "pair_stream_unary_reserve_p99_ms": pair_unary["reserve"]["p99_ms"],
            "pair_stream_unary_settle_p99_ms": pair_unary["settle"]["p99_ms"],
            "settle_only_server_cpu_ms_per_settle": settle_only["cpu_ms_per_settle"][
                "billing_server"
            ],
            "direct_settles_per_s": direct_report["settles_per_s"],
            "server_cpu_ms_per_pair": scaled["cpu_ms_per_pair"]["billing_server"],
            "baseline_server_cpu_ms_per_pair": base["cpu_ms_per_pair"]["billing_server"],
            "client_cpu_ms_per_pair": scaled["cpu_ms_per_pair"]["client"],
            "redis_cpu_ms_per_pair": scaled["cpu_ms_per_pair"]["redis"],
            "load_average": [round(x, 2) for x in os.getloadavg()],
        },
    }
