"""bench_engine's llama.cpp peer: our engine and llama.cpp (llama-cpp-python, built from its
source distribution by `make llama-cpp`) on the same checkpoint, prompts and greedy settings.

Per model (the ~120M bench model, and the 5M demo model): a GGUF converted from the same
safetensors with llama.cpp's own converter, weights and KV cache in float32 on both sides, the
same thread count on both sides. Two workloads, run alternately (engine, llama.cpp) for a few
rounds, medians reported:
- batch 1: one 128-token prompt, 128 greedy tokens; decode tokens/s from the first generated
  token to the last;
- 16 concurrent: 16 different 128-token prompts submitted at once, 128 greedy tokens each;
  output tokens / wall time (prefill included). llama.cpp decodes the 16 sequences together in
  one context (engine_llama_cpp_runner.py), as its `batched` example and server slots do.
EOS is ignored on both sides, so both produce exactly the planned tokens; the greedy outputs of
the two are compared as a check that they run the same model. The engine runs without prefix
caching here (the rounds repeat prompts; llama.cpp starts each from an empty KV cache), and
llama.cpp without flash attention (its CPU flash attention works partly in f16); one extra
llama.cpp run with its default flash attention is reported for reference.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from engine_llama_cpp_gguf import gguf_for, tokenizer_agreement
from engine_llama_cpp_runner import (
    FLASH_ATTN_AUTO,
    Generation,
    LlamaCppConfig,
    LlamaCppRunner,
)
from engine_support import goal
from gpu.runs import Request, run_batch

from llm_inference.engine.config import EngineConfig
from llm_inference.engine.engine import AsyncEngine

MODELS = ("bench-llama", "demo-llama")
OUTTYPE = "f32"  # the engine's CPU dtype is float32
FIRST_ID = 6  # ids below are the demo tokenizer's special tokens
PROMPT_TOKENS = 128
CONCURRENCY = 16
KV_BUDGET = 512 << 20
GOAL_CONCURRENT_RATIO = 1.0  # ours / llama.cpp at 16 concurrent


@dataclass(frozen=True, slots=True)
class Workload:
    single: Request
    concurrent: list[Request]


@dataclass(frozen=True, slots=True)
class Round:
    ours_decode_tps: float
    llama_decode_tps: float
    ours_concurrent_tps: float
    llama_concurrent_tps: float
    ours_tokens: list[list[int]]
    llama_tokens: list[list[int]]


def workload(vocab: int, max_tokens: int, seed: int = 0) -> Workload:
    rng = random.Random(seed)

    def prompt() -> list[int]:
        return [rng.randrange(FIRST_ID, vocab) for _ in range(PROMPT_TOKENS)]

    single = Request(prompt(), max_tokens)
    return Workload(single, [Request(prompt(), max_tokens) for _ in range(CONCURRENCY)])


def bench_llama_cpp(model_root: Path, threads: int, quick: bool) -> dict[str, Any]:
    """The "llama_cpp" section of engine.json ({"skipped": why} without llama-cpp-python)."""
    try:
        llama_cpp = importlib.import_module("llama_cpp")
    except ImportError as exc:
        return {"skipped": f"llama-cpp-python is not installed ({exc}): run `make llama-cpp`"}
    version = str(llama_cpp.__version__)
    load_before = os.getloadavg()[0]  # other tenants of a shared machine move both sides
    models = {
        name: _compare(model_root / name, version, threads, quick)
        for name in MODELS
        if (model_root / name / "config.json").is_file()
    }
    if not models:
        return {"skipped": f"no checkpoint of {', '.join(MODELS)} under {model_root}"}
    headline = next(iter(models.values()))
    ratio = headline["concurrent_16"]["ratio"]
    return {
        "peer": f"llama.cpp via llama-cpp-python {version} (built from its sdist)",
        "weights_dtype": {"engine": "float32", "llama_cpp": f"GGUF {OUTTYPE}"},
        "kv_cache_dtype": {"engine": "float32", "llama_cpp": "f32"},
        "threads": threads,
        "load_average_1m": {"start": load_before, "end": os.getloadavg()[0]},
        "headline_model": next(iter(models)),
        "batch1_decode_tokens_per_s": headline["batch_1"]["decode_tokens_per_s"],
        "concurrent16_tokens_per_s": headline["concurrent_16"]["output_tokens_per_s"],
        "models": models,
        "goal": goal(ratio, GOAL_CONCURRENT_RATIO, higher=True),
        "note": (
            "llama.cpp's 16 concurrent requests share one context (n_seq_max=16, a KV stream "
            "per sequence) and are decoded together: one llama_decode per step"
        ),
    }


def _compare(model_dir: Path, version: str, threads: int, quick: bool) -> dict[str, Any]:
    vocab = int(_config(model_dir)["vocab_size"])
    gguf = gguf_for(model_dir, version, OUTTYPE)
    load = workload(vocab, 32 if quick else 128)
    rounds = asyncio.run(_rounds(model_dir, gguf, load, threads, 1 if quick else 3))
    return {
        "llama_cpp_flash_attention": "disabled (float32 throughout, as the engine)",
        "gguf": gguf.name,
        "tokenizer_check": tokenizer_agreement(gguf, model_dir),
        "workload": {
            "prompt_tokens": PROMPT_TOKENS,
            "max_tokens": load.single.max_tokens,
            "concurrency": CONCURRENCY,
            "rounds": len(rounds),
        },
        "batch_1": _pair(rounds, "decode_tps", "decode_tokens_per_s"),
        "concurrent_16": _pair(rounds, "concurrent_tps", "output_tokens_per_s"),
        "greedy_agreement": _agreement(rounds[-1]),
        "llama_cpp_default_flash_attention": _flash_attention_run(gguf, load, threads),
    }


def _flash_attention_run(gguf: Path, load: Workload, threads: int) -> dict[str, Any]:
    """llama.cpp once more with its default flash attention (AUTO: on for CPU, partly f16):
    its speed at its own default precision, for reference next to the float32 comparison."""
    n = load.single.max_tokens
    config = LlamaCppConfig(gguf, threads, CONCURRENCY, _per_seq(load), FLASH_ATTN_AUTO)
    runner = LlamaCppRunner(config)
    try:
        runner.generate([load.single.prompt], 4)
        single = runner.generate([load.single.prompt], n)
        many = runner.generate([r.prompt for r in load.concurrent], n)
    finally:
        runner.close()
    return {
        "batch_1_decode_tokens_per_s": (n - 1) / single.decode_seconds,
        "concurrent_16_output_tokens_per_s": _tokens(many) / many.seconds,
        "rounds": 1,
    }


def _per_seq(load: Workload) -> int:
    """KV cells per sequence: prompt + output, rounded up to llama.cpp's 256-cell padding."""
    return -(-(PROMPT_TOKENS + load.single.max_tokens) // 256) * 256


async def _rounds(
    model_dir: Path, gguf: Path, load: Workload, threads: int, count: int
) -> list[Round]:
    torch.set_num_threads(threads)
    # No prefix caching: the rounds repeat the prompts, and llama.cpp starts each from an empty
    # KV cache; with it the engine would skip the repeated prefills.
    config = EngineConfig(
        kv_cache_memory_bytes=KV_BUDGET, num_threads=threads, enable_prefix_caching=False
    )
    engine = AsyncEngine.from_checkpoint(model_dir, config, model_dir.name)
    runner = LlamaCppRunner(LlamaCppConfig(gguf, threads, CONCURRENCY, _per_seq(load)))
    await engine.start()
    try:
        await run_batch(engine, [Request(load.single.prompt, 4)], "warm")
        runner.generate([load.single.prompt], 4)
        return [await _round(engine, runner, load, i) for i in range(count)]
    finally:
        await engine.stop()
        runner.close()


async def _round(engine: AsyncEngine, runner: LlamaCppRunner, load: Workload, i: int) -> Round:
    n = load.single.max_tokens
    ours_single = (await run_batch(engine, [load.single], f"b1-{i}")).outputs[0]
    llama_single = runner.generate([load.single.prompt], n)
    ours_many = await run_batch(engine, load.concurrent, f"c16-{i}")
    llama_many = runner.generate([r.prompt for r in load.concurrent], n)
    return Round(
        ours_decode_tps=(n - 1) / (ours_single.decode_ms / 1e3),
        llama_decode_tps=(n - 1) / llama_single.decode_seconds,
        ours_concurrent_tps=ours_many.tokens_per_s,
        llama_concurrent_tps=_tokens(llama_many) / llama_many.seconds,
        ours_tokens=[o.token_ids for o in ours_many.outputs],
        llama_tokens=llama_many.outputs,
    )


def _tokens(generation: Generation) -> int:
    return sum(len(o) for o in generation.outputs)


def _pair(rounds: Sequence[Round], metric: str, name: str) -> dict[str, Any]:
    def median(side: str) -> float:
        return statistics.median(float(getattr(r, f"{side}_{metric}")) for r in rounds)

    ours, theirs = median("ours"), median("llama")
    return {
        name: {"engine": ours, "llama_cpp": theirs},
        "ratio": ours / theirs,  # > 1: the engine is faster
        "runs": {
            "engine": [getattr(r, f"ours_{metric}") for r in rounds],
            "llama_cpp": [getattr(r, f"llama_{metric}") for r in rounds],
        },
    }


def _agreement(last: Round) -> dict[str, Any]:
    """Greedy outputs of the two engines on the 16 prompts (float32 both: they should match
    for long stretches; rounding differences can flip a near-tie and diverge after it)."""
    pairs = list(zip(last.ours_tokens, last.llama_tokens, strict=True))
    total = sum(len(a) for a, _ in pairs)
    return {
        "identical_sequences": sum(a == b for a, b in pairs),
        "sequences": len(pairs),
        "common_prefix_fraction": sum(_common_prefix(a, b) for a, b in pairs) / total,
    }


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    same = (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
    return next(same, min(len(a), len(b)))


def _config(model_dir: Path) -> dict[str, Any]:
    config: dict[str, Any] = json.loads((model_dir / "config.json").read_text("utf-8"))
    return config
