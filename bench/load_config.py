"""bench_load's constants (SLO rules, request mix) and its options."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MODEL = "demo-llama"
TENANT = "demo"
SUSTAINED_SHARE = 0.9  # share of a step's requests meeting the SLO for it to be sustained
MAX_ERROR_RATE = 0.01
BACKLOG_GROWTH, BACKLOG_SLACK = 1.5, 4.0  # last-quarter in-flight above 1.5x (+4) the second's
SOAK_SHARE = 0.7
RSS_GOAL_PCT = 10.0
# Redis holds the usage ledger and rate-limit state: it grows with traffic by design, so its
# RSS is reported but not held to the goal (the stack starts it only without REDIS_URL).
DATA_STORES = {"redis": "stores the usage ledger; grows with the requests served"}
# (share, words in the prompt) and (share, tokens to generate): a mix of chat-sized requests
PROMPT_MIX = ((0.5, 8), (0.3, 48), (0.2, 160))
OUTPUT_MIX = ((0.4, 8), (0.4, 32), (0.2, 96))
WORDS = (
    "river",
    "mountain",
    "sea",
    "forest",
    "city",
    "light",
    "stone",
    "cloud",
    "garden",
    "story",
    "music",
    "winter",
    "road",
    "window",
    "market",
    "bridge",
    "harbour",
    "field",
)


@dataclass(frozen=True)
class Options:
    rates: tuple[float, ...]
    max_rate: float
    step_s: float
    soak_s: float
    rss_interval_s: float
    slo_ttft_ms: float
    slo_tpot_ms: float
    late_ms: float
    timeout_s: float
    seed: int
    out: Path
    replot: bool = False
