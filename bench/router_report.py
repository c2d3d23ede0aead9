"""bench_router's report: machine facts, router.png, samples left out of the JSON."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any


def machine_info(load_before: tuple[float, float, float]) -> dict[str, Any]:
    return {
        # The cores may be shared with other work; the load average says how busy they were.
        "load_average_1m_before": round(load_before[0], 2),
        "load_average_1m_after": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "processes": "tokenizer, auth, billing, cache, inference x1-2, router: one process each",
    }


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    samples = result["variants"]["_samples"]
    for label in samples:
        ms = sorted(s * 1e3 for s in samples[label])
        left.plot(ms, [i / len(ms) for i in range(len(ms))], label=label)
    left.set(title="Chat latency, concurrency 1 (variants)", xlabel="ms", ylabel="CDF")
    left.legend()
    ttft = result["prefix_affinity"]["_samples"]
    for label in ("round_robin", "affinity"):
        ms = sorted(s * 1e3 for s in ttft[label])
        right.plot(ms, [i / len(ms) for i in range(len(ms))], label=label)
    right.set(title="TTFT, shared prefixes on 2 replicas", xlabel="ms", ylabel="CDF")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def strip_samples(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: strip_samples(v) for k, v in value.items() if not k.startswith("_")}
    return value
