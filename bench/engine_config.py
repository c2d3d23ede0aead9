"""bench_engine's constants: model, KV budget, goals."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MODEL = "demo-llama"
BENCH_MODEL = "bench-llama"  # `make bench-model`: 121M parameters, where compute dominates a step
# Trained, so it copies text: the speculative-decoding workload runs on it (committed checkpoint).
DEMO_CHAT = ROOT / "infra" / "model" / "demo-chat"
# The bench model's mixed workload: 64 requests, shorter than the demo model's so that the
# transformers baseline (static batch of 64 padded to the longest) stays within minutes.
BENCH_PROMPTS = (16, 192)
BENCH_OUTPUTS = (8, 96)
DECODE_CONTEXTS = (128, 512, 1024, 2048, 4096)
DECODE_BATCH = 8
SPECULATIVE_TOKENS = 4
GOAL_SPECULATIVE_SPEEDUP = 1.5
FIRST_ID = 6  # ids below are special tokens of the demo tokenizer
KV_BUDGET = 512 << 20
GOAL_THROUGHPUT_RATIO = 3.0
GOAL_TTFT_RATIO = 3.0
GOAL_RSS_DRIFT = 0.05
