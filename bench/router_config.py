"""bench_router's constants: goals, workload shape, the words prompts are made of."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
# The entry script: it also runs each helper process (--deps).
ENTRY = Path(__file__).resolve().with_name("bench_router.py")
PRICES = ROOT / "infra" / "config" / "prices.yaml"
MODEL = "demo-llama"
MIB = 1 << 20
START_TIMEOUT_S = 120.0
GOAL_ADDED_P50_MS = 3.0
GOAL_TTFT_SPEEDUP = 1.5
OVERHEAD_MAX_TOKENS = 4
PREFIXES, ASKS_PER_PREFIX, CONCURRENCY = 8, 6, 2
PREFIX_WORDS = 240  # about 600 prompt tokens with the demo tokenizer
AFFINITY_KV_MIB = 12  # about 3,000 tokens: half the prefixes fit on one replica
SCOPES = "completion:write,embedding:read"
WORDS = [
    "river",
    "mountain",
    "quiet",
    "engine",
    "harbor",
    "signal",
    "lantern",
    "copper",
    "meadow",
    "orbit",
    "canyon",
    "velvet",
    "ember",
    "glacier",
    "thunder",
    "willow",
    "compass",
    "falcon",
    "marble",
    "prairie",
    "summit",
    "tunnel",
    "beacon",
    "orchard",
]
