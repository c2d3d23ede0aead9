"""Where the fleet scenarios put their figures: resilience.json under "scenarios" (shared
with the other chaos scenarios and the load benchmark, under the same lock) and fleet.json
with a PNG of throughput and TTFT over time."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .fleet import StreamResult

RESULTS = Path(__file__).resolve().parents[4] / "bench" / "results"


def record(file: str, key: str, figures: dict[str, Any]) -> None:
    """Merge `figures` into results/`file` under "scenarios"/`key` (resilience.json) or
    `key` (fleet.json), keeping what other writers put there."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / file
    figures = figures | {
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    with _locked(path.with_suffix(".lock")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        target = data.setdefault("scenarios", {}) if file == "resilience.json" else data
        target[key] = figures
        temporary = path.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        temporary.replace(path)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def timeline(
    outcomes: Sequence[StreamResult], origin: float, bucket_s: float = 1.0
) -> dict[str, Any]:
    """Per `bucket_s`: tokens per second finished and the mean TTFT of requests started."""
    end = max((o.ended for o in outcomes), default=origin)
    buckets = int((end - origin) / bucket_s) + 1
    tokens = [0.0] * buckets
    ttft: list[list[float]] = [[] for _ in range(buckets)]
    for o in outcomes:
        tokens[int((o.ended - origin) / bucket_s)] += o.tokens / bucket_s
        ttft[int((o.started - origin) / bucket_s)].append(o.ttft_s)
    return {
        "bucket_s": bucket_s,
        "tokens_per_s": [round(t, 2) for t in tokens],
        "ttft_ms": [round(1e3 * sum(v) / len(v), 1) if v else None for v in ttft],
    }


def plot(path: Path, series: dict[str, tuple[dict[str, Any], list[tuple[float, str]]]]) -> None:
    """One row per scenario: throughput and TTFT over time, events marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(series), 2, figsize=(12, 3.2 * len(series)), squeeze=False)
    for row, (name, (line, events)) in enumerate(series.items()):
        xs = [i * line["bucket_s"] for i in range(len(line["tokens_per_s"]))]
        axes[row][0].plot(xs, line["tokens_per_s"])
        axes[row][0].set_title(f"{name}: tokens/s")
        ttft = [(x, v) for x, v in zip(xs, line["ttft_ms"], strict=True) if v is not None]
        axes[row][1].plot([x for x, _ in ttft], [v for _, v in ttft], marker=".")
        axes[row][1].set_title(f"{name}: TTFT (ms)")
        for ax in axes[row]:
            ax.set_xlabel("s")
            for at, label in events:
                ax.axvline(at, color="grey", linestyle=":")
                ax.text(at, ax.get_ylim()[1] * 0.9, label, fontsize=7, rotation=90)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
