"""bench_load's load.png: latency, throughput and RSS panels."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot(load: dict[str, Any], soaked: dict[str, Any] | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 3 if soaked else 2
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels, 4.2))
    _latency_panel(axes[0], load["steps"])
    _throughput_panel(axes[1], load["steps"])
    for ax in axes[:2]:
        if load["saturation_rps"]:
            ax.axvline(load["saturation_rps"], color="black", alpha=0.3)
    if soaked:
        _rss_panel(axes[2], soaked)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _latency_panel(ax: Any, steps_: list[dict[str, Any]]) -> None:
    rates = [s["offered_rps"] for s in steps_]
    lines = (("ttft_ms", "p50", "o-"), ("ttft_ms", "p99", "o--"), ("e2e_ms", "p50", "s-"))
    for metric, q, style in (*lines, ("e2e_ms", "p90", "s-."), ("e2e_ms", "p99", "s--")):
        values = [s[metric][q] for s in steps_]
        nan = float("nan")
        ax.plot(rates, [nan if v is None else v for v in values], style, label=f"{metric[:-3]} {q}")
    ax.set_yscale("log")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("ms from scheduled arrival")
    ax.set_title("latency vs offered load")
    ax.legend(fontsize=8)


def _throughput_panel(ax: Any, steps_: list[dict[str, Any]]) -> None:
    rates = [s["offered_rps"] for s in steps_]
    ax.plot(rates, rates, ":", color="grey", label="offered")
    answered = [s["throughput_rps"] for s in steps_]
    ax.plot(rates, answered, "o-", label="answered/s (arrivals of the step)")
    ax.plot(rates, [s["goodput_rps"] for s in steps_], "s-", label="goodput (SLO met)/s")
    ax.set_xlabel("offered load (requests/s)")
    ax.set_ylabel("requests/s")
    ax.set_title("throughput and goodput")
    ax.legend(fontsize=8, loc="upper left")
    errors = ax.twinx()
    error_pct = [s["error_rate"] * 100 for s in steps_]
    errors.plot(rates, error_pct, "x--", color="red")
    errors.set_ylim(0, max(5.0, *error_pct) * 1.1)
    errors.set_ylabel("errors %", color="red")


def _rss_panel(ax: Any, soaked: dict[str, Any]) -> None:
    rss = soaked["rss"]
    series = rss["series_mib"]
    for name in rss["per_process"]:
        ax.plot([p["t"] for p in series], [p[name] for p in series], label=name)
    ax.set_xlabel("soak time (s)")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title(f"soak at {soaked['offered_rps']} req/s: max growth {rss['max_growth_pct']}%")
    ax.legend(fontsize=7)
