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
    fig, grid = plt.subplots(2, 3, figsize=(15, 9))
    axes = grid[0]
    _throughput_bars(axes[0], tput)
    _throughput_bars(grid[1][0], summary["throughput_demo"])
    _decode_lines(grid[1][1], summary["decode_step"])
    _speculative_bars(grid[1][2], summary["speculative"])
    axes[1].hist(tput["best_engine"]["ttft_ms"], bins=16, color="tab:blue")
    axes[1].set_xlabel("time to first token (ms)")
    axes[1].set_ylabel("requests")
    axes[1].set_title(f"engine TTFT ({tput['model']}), {tput['requests']} requests at once")
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


def _throughput_bars(ax: Any, tput: dict[str, Any]) -> None:
    results = [(f"engine\n{k}", r) for k, r in tput["engine"].items()] + [
        (f"HF generate\n{k.replace(',', chr(10))}", r) for k, r in tput["transformers"].items()
    ]
    colors = ["tab:blue"] * len(tput["engine"]) + ["tab:gray"] * len(tput["transformers"])
    bars = ax.bar(
        [name for name, _ in results], [r["output_tokens_per_s"] for _, r in results], color=colors
    )
    ax.bar_label(bars, fmt="%.0f")
    ax.set_ylabel("output tokens / s")
    ax.tick_params(axis="x", labelsize=7)
    ax.set_title(
        f"{tput['model']}, {tput['requests']} mixed requests: {tput['ratio']:.1f}x transformers"
    )


def _decode_lines(ax: Any, decode: dict[str, Any]) -> None:
    for (name, result), color in zip(decode.items(), ("tab:blue", "tab:orange"), strict=False):
        if "skipped" in result:
            continue
        ax.plot(result["contexts"], result["paged_ms"], "o-", color=color, label=f"{name} paged")
        ax.plot(result["contexts"], result["gather_ms"], "s--", color=color, label=f"{name} gather")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("decode step (ms), batch 8")
    ax.set_title("decode step: paged kernel vs gather")
    ax.legend(fontsize=7)


def _speculative_bars(ax: Any, spec: dict[str, Any]) -> None:
    runs = [(spec["model"], spec), (spec["random_model"]["model"], spec["random_model"])]
    labels, heights, colors = [], [], []
    for name, result in runs:
        tokens = result["output_tokens"]
        labels += [f"{name}\noff", f"{name}\non"]
        heights += [tokens / result["seconds_off"], tokens / result["seconds_on"]]
        colors += ["tab:gray", "tab:blue"]
    bars = ax.bar(labels, heights, color=colors)
    ax.bar_label(bars, fmt="%.0f")
    ax.set_ylabel("output tokens / s, one request at a time")
    ax.set_title(
        f"prompt lookup {spec['speedup']:.2f}x, acceptance {spec['acceptance']:.0%}\n"
        f"(random model {spec['random_model']['speedup']:.2f}x)"
    )


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
    demo = summary["throughput_demo"]
    print(f"demo model: {demo['ratio']:.2f}x wall, {demo['cpu_time_ratio']:.2f}x CPU time")
    for name, result in summary["decode_step"].items():
        if "skipped" not in result:
            pairs = zip(result["contexts"], result["gather_over_paged"], strict=True)
            print(
                f"decode step {name}: gather/paged " + ", ".join(f"{c}: {r:.2f}x" for c, r in pairs)
            )
    spec = summary["speculative"]
    print(
        f"speculative ({spec['model']}): {spec['speedup']:.2f}x, acceptance "
        f"{spec['acceptance']:.1%}, identical {spec['identical_greedy_output']}, "
        f"{spec['tokens_per_step_on']:.2f} tokens/step; step ms by rows {spec['step_ms_by_rows']}"
    )
    ceiling = spec["lookup_ceiling"]
    print(
        f"  prompt-lookup ceiling on these outputs: {ceiling['best_tokens_per_step']:.2f} "
        f"tokens/step (best of {ceiling['settings_tried']} settings: {ceiling['best_setting']})"
    )
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
