"""bench_load's RSS sampling of the stack's processes and its growth over a soak."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from load_analysis import mean
from load_config import DATA_STORES, RSS_GOAL_PCT


@dataclass(frozen=True)
class RssSample:
    """RSS in KiB of each stack process, `at` seconds into the soak."""

    at: float
    kib: dict[str, int]


@dataclass
class Sampler:
    """RSS of every stack process, sampled while a soak runs."""

    pids: dict[str, int]
    samples: list[RssSample] = field(default_factory=list)

    def sample(self, at: float) -> None:
        self.samples.append(RssSample(at, {name: rss_kib(pid) for name, pid in self.pids.items()}))


def rss_kib(pid: int) -> int:
    """VmRSS of `pid` in KiB; 0 once the process is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return 0
    return 0


def rss_growth(sampler: Sampler, soak_s: float) -> dict[str, Any]:
    window = min(60.0, soak_s / 4)
    warmup = window
    first = [s.kib for s in sampler.samples if warmup <= s.at < warmup + window]
    last = [s.kib for s in sampler.samples if s.at >= soak_s - window]
    per: dict[str, Any] = {}
    for name in sampler.pids:
        a = mean([s[name] for s in first])
        b = mean([s[name] for s in last])
        growth = round((b - a) / a * 100, 2) if a else None
        per[name] = {
            "first_mib": round(a / 1024, 1),
            "last_mib": round(b / 1024, 1),
            "growth_pct": growth,
        }
    checked = [v["growth_pct"] for n, v in per.items() if n not in DATA_STORES]
    worst = max((g for g in checked if g is not None), default=0.0)
    return {
        "window_s": window,
        "warmup_s": warmup,
        "samples": len(sampler.samples),
        "per_process": per,
        "max_growth_pct": worst,
        "goal_pct": RSS_GOAL_PCT,
        "goal_excludes": DATA_STORES,
        "met": worst <= RSS_GOAL_PCT,
        "series_mib": [
            {"t": round(s.at, 1), **{n: round(v / 1024, 1) for n, v in s.kib.items()}}
            for s in sampler.samples
        ],
    }
