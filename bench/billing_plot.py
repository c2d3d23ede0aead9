"""bench_billing's billing.png: settles/s and p99 per level, open-loop p99 per run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from billing_config import (
    BATCHED_ARM,
    GOAL_P99_MS,
    GOAL_SETTLES_PER_S,
    GOAL_STREAM_ARM,
    PAIR_STREAM_ARM,
    PAIR_STREAM_UNARY_ARM,
    SETTLE_ONLY_ARM,
    STREAM_ARM,
    STREAM_TIMER_ARM,
)
from billing_verdicts import pair_p99


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = result["levels"]
    labels = [str(level["concurrency"]) for level in levels]
    fig, (left, right, open_loop) = plt.subplots(1, 3, figsize=(15, 4))
    width, xs = 0.16, range(len(levels))
    arms = (
        (-2 * width, "grpc", "gRPC, workers"),
        (-width, "grpc_baseline_1x1", "gRPC, 1 process"),
        (0.0, BATCHED_ARM, "SettleBatch, 1 process"),
        (width, SETTLE_ONLY_ARM, "settle-only batches"),
        (2 * width, "direct_in_process", "in-process"),
    )
    for offset, arm, name in arms:
        at = [x + offset for x in xs]
        p99 = [lv[arm].get("settle", lv[arm].get("batch_call"))["p99_ms"] for lv in levels]
        left.bar(at, [lv[arm]["settles_per_s"] for lv in levels], width, label=name)
        right.bar(at, p99, width, label=name)
    left.axhline(GOAL_SETTLES_PER_S, color="red", linestyle="--", label="goal")
    right.axhline(GOAL_P99_MS, color="red", linestyle="--", label="goal")
    left.set(title="Settles per second", xlabel="concurrency", xticks=list(xs), xticklabels=labels)
    right.set(
        title="Settle (batch call) p99 (ms)",
        xlabel="concurrency",
        xticks=list(xs),
        xticklabels=labels,
    )
    left.legend()
    right.legend()
    _plot_open_loop(open_loop, levels)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_open_loop(ax: Any, levels: list[dict[str, Any]]) -> None:
    """The open-loop arms' p99 in each of their runs (one run per level), against the goal."""
    arms = (
        (GOAL_STREAM_ARM, "settles, goal + 5%"),
        (STREAM_ARM, "settles, goal + 25%"),
        (STREAM_TIMER_ARM, "settles, timer-only batcher"),
        (PAIR_STREAM_ARM, "Reserve+settle, ReserveBatch"),
        (PAIR_STREAM_UNARY_ARM, "Reserve+settle, unary Reserve"),
    )
    width = 0.8 / len(arms)
    for n, (arm, name) in enumerate(arms):
        at = [run + (n - (len(arms) - 1) / 2) * width for run in range(len(levels))]
        p99 = [pair_p99(lv[arm]) if "reserve" in lv[arm] else lv[arm]["settle"]["p99_ms"]
               for lv in levels]  # fmt: skip
        ax.bar(at, p99, width, label=name)
    ax.axhline(GOAL_P99_MS, color="red", linestyle="--", label="goal")
    ax.set(title="Open loop: p99 (ms) per run", xlabel="run", xticks=list(range(len(levels))))
    ax.legend(fontsize="small")
