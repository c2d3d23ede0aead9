"""bench_engine's constants: model, KV budget, goals."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MODEL = "demo-llama"
FIRST_ID = 6  # ids below are special tokens of the demo tokenizer
KV_BUDGET = 512 << 20
GOAL_THROUGHPUT_RATIO = 3.0
GOAL_TTFT_RATIO = 3.0
GOAL_RSS_DRIFT = 0.05
