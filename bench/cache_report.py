"""bench_cache's plot and goal verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import machine
import numpy as np
from cache_quality import GOALS, THRESHOLD

# --- report --------------------------------------------------------------------------------


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = result["quality"]["curve"]
    t = [c["threshold"] for c in curve]
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    for variant, style in (("guard", "-"), ("no_guard", "--")):
        label = "with guard" if variant == "guard" else "threshold only"
        left.plot(t, [c["paraphrase_hit_rate"][variant] for c in curve], style, color="tab:blue",
                  label=f"paraphrase hit rate ({label})")  # fmt: skip
        left.plot(t, [c["qqp_nondup_false_hit_rate"][variant] for c in curve], style,
                  color="tab:red", label=f"QQP non-duplicate false hits ({label})")  # fmt: skip
    left.axvline(THRESHOLD, color="grey", lw=0.8)
    left.axhline(GOALS["paraphrase_hit_rate"], color="tab:blue", lw=0.5, ls=":")
    left.axhline(GOALS["qqp_nondup_false_hit_rate"], color="tab:red", lw=0.5, ls=":")
    left.set(xlabel="cosine similarity threshold", ylabel="rate", ylim=(0, 1),
             title="Semantic cache: hit rate vs false-hit rate")  # fmt: skip
    left.legend(fontsize=7)
    rows = result["latency"]
    labels = [f"{r['entries'] // 1000}k" for r in rows]
    x = np.arange(len(rows))
    bars = (
        ("exact_hit", "tab:green"),
        ("semantic_question", "tab:purple"),
        ("semantic_paraphrase", "tab:pink"),
        ("search_prefilter", "tab:orange"),
        ("search_full_scan_baseline", "tab:grey"),
    )
    for offset, (name, color) in zip((-0.36, -0.18, 0.0, 0.18, 0.36), bars, strict=True):
        p50 = [r[name]["p50_ms"] for r in rows]
        p99 = [r[name]["p99_ms"] for r in rows]
        right.bar(x + offset, p50, 0.17, color=color, label=f"{name} p50")
        right.scatter(x + offset, p99, color=color, marker="_", s=150)
    right.set_xticks(x, labels)
    right.set(ylabel="ms (bars p50, ticks p99)", title="Lookup latency (2 cores)")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def goals(result: dict[str, Any]) -> dict[str, Any]:
    q, rows = result["quality"], result["latency"]
    largest = max(rows, key=lambda r: r["entries"])
    checks = {
        "exact_p50_ms": (max(r["exact_hit"]["p50_ms"] for r in rows), "<="),
        "semantic_p50_ms_at_100k": (largest["semantic_question"]["p50_ms"], "<="),
        "paraphrase_hit_rate": (q["paraphrase_hit_rate"]["guard"], ">="),
        "qqp_nondup_false_hit_rate": (q["qqp_nondup_false_hit_rate"]["guard"], "<="),
    }
    verdicts = {
        name: {
            "goal": GOALS[name],
            "measured": round(value, 4),
            "met": value <= GOALS[name] if op == "<=" else value >= GOALS[name],
        }
        for name, (value, op) in checks.items()
    }
    # A lookup is one gRPC hop: next to the exact goal, what a bare hop costs on this machine.
    floor = result["environment"]["probe"]["grpc_unary"]["p50_ms"]
    verdicts["exact_p50_ms"]["machine_floor"] = machine.floor_note(
        GOALS["exact_p50_ms"], floor, "p50 of a bare grpc.aio unary call (bench/machine.py)"
    )
    return verdicts
