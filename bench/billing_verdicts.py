"""bench_billing's verdicts: the goal (settles/s and p99) judged on each metric."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from billing_config import (
    BATCH_MAX,
    BATCH_SHAPE,
    BATCHED_ARM,
    GOAL_P99_MS,
    GOAL_SETTLES_PER_S,
    GOAL_STREAM_ARM,
    GRPC_ARMS,
    OPEN_LOOP_ARMS,
    PAIR_STREAM_ARM,
    PAIR_STREAM_UNARY_ARM,
    RESERVE_SHAPE,
    SETTLE_ONLY_ARM,
    SETTLE_ONLY_CALLS_IN_FLIGHT,
    STREAM_ARM,
)


def goal_verdicts(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The goal judged on each metric: unary, batched, settle-only, open-loop streams."""
    return [
        _verdict(
            "unary_pairs",
            "Reserve+Settle pairs, one unary call each: settles/s (= pairs/s) and the Settle "
            "call's p99; best of the unary set-ups and levels",
            levels,
            GRPC_ARMS,
            lambda r: r["settle"]["p99_ms"],
        ),
        _verdict(
            "batched_pairs",
            "Reserve unary + settles coalesced into SettleBatch by the router's SettleBatcher "
            f"({BATCH_SHAPE}), 1 server x 1 client process: "
            "settles/s (= pairs/s, every settle answered) and p99 of a settle's queue wait "
            "plus its SettleBatch call",
            levels,
            (BATCHED_ARM,),
            lambda r: r["settle"]["p99_ms"],
        ),
        _verdict(
            "settle_only_batches",
            f"settle-only: SettleBatch calls of {BATCH_MAX} pre-reserved requests "
            f"({SETTLE_ONLY_CALLS_IN_FLIGHT} in flight), 1 server x 1 client process: "
            "settles/s and the SettleBatch call's p99",
            levels,
            (SETTLE_ONLY_ARM,),
            lambda r: r["batch_call"]["p99_ms"],
        ),
        _verdict(
            "settle_stream",
            "open loop: settles of reserved requests arriving at a fixed rate (the goal + 25%) "
            f"into the router's SettleBatcher ({BATCH_SHAPE}), "
            "1 server x 1 client process: settles/s answered and p99 of a settle from when it "
            "was due to its answer (what the router's settlement path sees)",
            levels,
            (STREAM_ARM,),
            lambda r: r["settle"]["p99_ms"],
        ),
        _verdict(
            "settle_stream_at_goal",
            "the same open loop at the goal's rate + 5% (what is answered over a round falls a "
            "little short of what is offered): settles/s answered and p99 of a settle from "
            "when it was due to its answer",
            levels,
            (GOAL_STREAM_ARM,),
            lambda r: r["settle"]["p99_ms"],
        ),
        _verdict(
            "pair_stream_at_goal",
            "open loop of whole requests at the goal's rate + 5%, as the router sends them: "
            f"each one's Reserve coalesced into ReserveBatch calls ({RESERVE_SHAPE}), then its "
            "settle through the router's SettleBatcher, 1 server x 1 client process: "
            "settles/s answered and the larger of two p99s, the Reserve's from when the "
            "request was due and the settle's from when it was submitted",
            levels,
            (PAIR_STREAM_ARM,),
            pair_p99,
        ),
        _verdict(
            "pair_stream_unary_reserve_at_goal",
            "the same open loop with a unary Reserve call per request (the router before "
            "ReserveBatch): the in-run baseline of the pair stream",
            levels,
            (PAIR_STREAM_UNARY_ARM,),
            pair_p99,
        ),
    ]


def pair_p99(report: dict[str, Any]) -> float:
    return float(max(report["reserve"]["p99_ms"], report["settle"]["p99_ms"]))


def _verdict(
    metric: str,
    meaning: str,
    levels: list[dict[str, Any]],
    arms: tuple[str, ...],
    p99: Callable[[dict[str, Any]], float],
) -> dict[str, Any]:
    """The goal judged on one metric, at the arm and level with the most settles/s; for the
    open-loop arm, whose offered rate is the same at every level, at its median p99 run."""
    runs = [(lv["concurrency"], arm, lv[arm]) for lv in levels for arm in arms]
    if arms[0] in OPEN_LOOP_ARMS:
        concurrency, arm, best = sorted(runs, key=lambda run: p99(run[2]))[len(runs) // 2]
    else:
        concurrency, arm, best = max(runs, key=lambda run: run[2]["settles_per_s"])
    return {
        "metric": metric,
        "meaning": meaning,
        "met_measured": best["settles_per_s"] >= GOAL_SETTLES_PER_S and p99(best) <= GOAL_P99_MS,
        "arm": arm,
        "concurrency": concurrency,
        "settles_per_s": best["settles_per_s"],
        "p99_ms": p99(best),
    }
