"""bench_engine's report: machine facts, engine.png, the printed summary."""

from __future__ import annotations

import os
import platform
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch


def machine_info(thread_counts: Sequence[int]) -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "torch_thread_counts": list(thread_counts),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default (active)"),
        "load_average_1m_at_start": os.getloadavg()[0],
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tput = summary["throughput"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    results = [(f"engine\n{k}", r) for k, r in tput["engine"].items()] + [
        (f"HF generate\n{k.replace(',', chr(10))}", r) for k, r in tput["transformers"].items()
    ]
    colors = ["tab:blue"] * len(tput["engine"]) + ["tab:gray"] * len(tput["transformers"])
    bars = axes[0].bar(
        [name for name, _ in results], [r["output_tokens_per_s"] for _, r in results], color=colors
    )
    axes[0].bar_label(bars, fmt="%.0f")
    axes[0].set_ylabel("output tokens / s")
    axes[0].tick_params(axis="x", labelsize=7)
    axes[0].set_title(f"{tput['requests']} mixed requests: best {tput['ratio']:.1f}x transformers")
    axes[1].hist(tput["best_engine"]["ttft_ms"], bins=16, color="tab:blue")
    axes[1].set_xlabel("time to first token (ms)")
    axes[1].set_ylabel("requests")
    axes[1].set_title("engine TTFT, 64 requests submitted at once")
    prefix = summary["shared_prefix"]
    modes = ["burst", "sequential"]
    width = 0.38
    xs = range(len(modes))
    for offset, key, color in (
        (-width / 2, "with_cache", "tab:blue"),
        (width / 2, "without_cache", "tab:gray"),
    ):
        heights = [prefix[key][m]["mean_ttft_ms"] for m in modes]
        drawn = axes[2].bar([x + offset for x in xs], heights, width, label=key, color=color)
        axes[2].bar_label(drawn, fmt="%.0f")
    axes[2].set_xticks(list(xs), [f"{m}\n{prefix[f'{m}_ttft_ratio']:.1f}x lower" for m in modes])
    axes[2].set_ylabel("mean TTFT (ms)")
    axes[2].set_title("32 requests sharing a 384-token prefix")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_summary(summary: dict[str, Any]) -> None:
    tput = summary["throughput"]
    rows = [(f"engine, {k}", r) for k, r in tput["engine"].items()] + [
        (f"transformers generate, {k}", r) for k, r in tput["transformers"].items()
    ]
    for name, result in rows:
        print(
            f"{name}: {result['output_tokens_per_s']:,.0f} output tok/s "
            f"({result['output_tokens_per_cpu_s']:,.0f} per CPU-second)"
        )
    print(f"best vs best: {tput['ratio']:.2f}x wall, {tput['cpu_time_ratio']:.2f}x CPU time")
    prefix = summary["shared_prefix"]
    for mode in ("burst", "sequential"):
        with_cache = prefix["with_cache"][mode]["mean_ttft_ms"]
        without = prefix["without_cache"][mode]["mean_ttft_ms"]
        print(f"shared prefix ({mode}): mean TTFT {with_cache:.1f} ms cached vs {without:.1f} ms")
    rss = summary["rss"]
    print(f"RSS {rss['rss_first_mib']:.1f} -> {rss['rss_last_mib']:.1f} MiB ({rss['drift']:+.2%})")
    int8 = summary["int8"]
    print(
        f"int8: top-1 agreement {int8['top1_agreement']:.1%}, "
        f"max |logit error| {int8['max_abs_logit_error']:.4f}"
    )
    for name, result in summary["goals"].items():
        print(
            f"goal {name}: {result['value']:.3f} vs {result['target']} -> "
            f"{'met' if result['met'] else 'NOT met'}"
        )
