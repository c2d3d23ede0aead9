"""Inference engine: continuous batching vs transformers generate, decode attention with and
without the gather, speculative decoding, prefix-cache TTFT, RSS, int8.

In one process and one run:
- throughput: on the 121M bench model (`make bench-model`), 64 greedy requests (prompts
  16-192 tokens, outputs 8-96, EOS ignored so the lengths are as planned) submitted at once
  to the engine, vs transformers `generate` over the same requests in static left-padded
  batches (each batch runs to its longest output), at the largest thread count; engine runs
  before and after the transformers run (the slower counts);
- throughput_demo: the same comparison on the 5M demo checkpoint (prompts 16-512, outputs
  16-256) at each torch thread count, each side judged at its best setting, engine runs
  interleaved with the transformers runs (median counts); CPU-time rates are reported
  next to wall-clock, as the machine may be shared;
- decode_step: decode step time vs context length (batch 8), paged kernel vs gather, both models;
- speculative: prompt lookup on vs off, code/JSON editing prompts, one request at a time, on
  the trained demo-chat model (and on the random demo model, where lookups rarely hit);
- shared prefix: 32 requests sharing a 384-token system prompt, mean TTFT with and without
  prefix caching, both submitted at once (burst) and one after another (sequential);
- memory: RSS over 2,000 sequential short requests;
- int8: logit error and greedy agreement of weight-only int8 against float32;
- llama_cpp: llama.cpp (llama-cpp-python, `make llama-cpp`) on the same checkpoints, batch-1
  decode and 16-concurrent tokens/s side by side (engine_llama_cpp.py).
Writes bench/results/engine.json and engine.png.

Usage: python bench/bench_engine.py [--model-root .cache/models] [--threads 1,2]
       [--hf-batch-sizes 64] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from engine_baselines import bench_int8
from engine_config import (
    BENCH_MODEL,
    BENCH_OUTPUTS,
    BENCH_PROMPTS,
    DECODE_BATCH,
    DECODE_CONTEXTS,
    DEMO_CHAT,
    GOAL_RSS_DRIFT,
    GOAL_SPECULATIVE_SPEEDUP,
    GOAL_THROUGHPUT_RATIO,
    GOAL_TTFT_RATIO,
    MODEL,
    RESULTS,
    ROOT,
    SPECULATIVE_TOKENS,
)
from engine_decode import bench_decode_steps, step_rows_ms
from engine_grid import bench_throughput_grid
from engine_llama_cpp import bench_llama_cpp
from engine_prefix import bench_prefix
from engine_report import machine_info, plot, print_summary
from engine_rss import bench_rss
from engine_speculative import bench_speculative
from engine_support import ensure_passive_openmp, goal, timed
from engine_workloads import mixed_requests, shared_prefix_requests

from llm_inference.engine.config import EngineConfig
from llm_inference.engine.core import EngineCore


def run(
    model_root: Path, thread_counts: Sequence[int], quick: bool, hf_batch_sizes: Sequence[int]
) -> dict[str, Any]:
    model_dir, big_dir = model_root / MODEL, model_root / BENCH_MODEL
    vocab = int(json.loads((model_dir / "config.json").read_text("utf-8"))["vocab_size"])
    machine = machine_info(thread_counts)
    count = 16 if quick else 64
    sections: dict[str, float] = {}
    with timed(sections, "throughput"):
        torch.set_num_threads(max(thread_counts))
        big = mixed_requests(count, 0, vocab, BENCH_PROMPTS, BENCH_OUTPUTS)
        throughput = bench_throughput_grid(
            big_dir, big, [max(thread_counts)], hf_batch_sizes, max_engine_runs=2
        )
    with timed(sections, "throughput_demo"):
        mixed = mixed_requests(count, seed=0, vocab=vocab)
        demo = bench_throughput_grid(model_dir, mixed, thread_counts, hf_batch_sizes)
    torch.set_num_threads(demo["best_engine"]["threads"])
    with timed(sections, "decode_step"):
        contexts = DECODE_CONTEXTS[:3] if quick else DECODE_CONTEXTS
        decode = {
            name: bench_decode_steps(path, contexts, DECODE_BATCH, 1 << 30)
            for name, path in ((BENCH_MODEL, big_dir), (MODEL, model_dir))
        }
    with timed(sections, "speculative"):
        speculative = bench_speculative(DEMO_CHAT, SPECULATIVE_TOKENS, 1 if quick else 3)
        speculative["random_model"] = bench_speculative(model_dir, SPECULATIVE_TOKENS, 1)
        big_core = EngineCore.from_checkpoint(big_dir, EngineConfig(), BENCH_MODEL)
        speculative["bench_model_step_ms_by_rows"] = step_rows_ms(
            big_core, (1, 1 + SPECULATIVE_TOKENS)
        )
        del big_core
    with timed(sections, "shared_prefix"):
        requests = shared_prefix_requests(32, 1, vocab)
        prefix = asyncio.run(bench_prefix(model_dir, requests, rounds=1 if quick else 3))
    with timed(sections, "rss"):
        rss = asyncio.run(bench_rss(model_dir, 200 if quick else 2000, vocab))
    with timed(sections, "int8"):
        int8 = bench_int8(model_dir, vocab)
    with timed(sections, "llama_cpp"):  # same thread count as the engine's best setting
        llama_cpp = bench_llama_cpp(model_dir.parent, torch.get_num_threads(), quick)
    return {
        "benchmark": "inference engine vs transformers generate (static padded batches)",
        "model": BENCH_MODEL,
        "dtype": "float32",
        "device": "cpu",
        "throughput": throughput,
        "throughput_demo": demo,
        "decode_step": decode,
        "speculative": speculative,
        "shared_prefix": prefix,
        "rss": rss,
        "int8": int8,
        "llama_cpp": llama_cpp,
        "goals": {
            "throughput_ratio": goal(throughput["ratio"], GOAL_THROUGHPUT_RATIO, higher=True),
            "throughput_ratio_demo": goal(demo["ratio"], GOAL_THROUGHPUT_RATIO, higher=True),
            "speculative_speedup": goal(
                speculative["speedup"], GOAL_SPECULATIVE_SPEEDUP, higher=True
            ),
            "prefix_ttft_ratio_burst": goal(
                prefix["burst_ttft_ratio"], GOAL_TTFT_RATIO, higher=True
            ),
            "prefix_ttft_ratio_sequential": goal(
                prefix["sequential_ttft_ratio"], GOAL_TTFT_RATIO, higher=True
            ),
            "rss_drift": goal(abs(rss["drift"]), GOAL_RSS_DRIFT, higher=False),
        },
        "section_seconds": sections,
        "machine": machine,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model-root", type=Path, default=ROOT / ".cache" / "models")
    parser.add_argument("--threads", default="1,2", help="torch thread counts to try, both sides")
    parser.add_argument("--hf-batch-sizes", default="64", help="static batch sizes to try")
    parser.add_argument("--quick", action="store_true", help="smaller workload (smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if argv is None:
        ensure_passive_openmp()
    root = args.model_root.resolve()
    for name, target in ((MODEL, "model"), (BENCH_MODEL, "bench-model")):
        if not (root / name / "config.json").is_file():
            print(f"no checkpoint at {root / name}: run `make {target}` first", file=sys.stderr)
            return 2
    sizes = [int(s) for s in args.hf_batch_sizes.split(",") if s.strip()]
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    summary = run(root, threads, args.quick, sizes)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engine.json").write_text(json.dumps(summary, indent=2) + "\n", "utf-8")
    plot(summary, args.out / "engine.png")
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
