"""bench_engine's decode step time vs context length, with and without the gather.

Sequences are placed straight into the paged cache (blocks allocated, K/V left as they are:
timing does not depend on the values), so no prefill is needed to reach long contexts; each
point times the model runner's decode step for a batch of rows at one context length, with
the paged kernel (attention in place over the block tables) and with the gather path (each
row's blocks copied into a contiguous buffer first, then bmm + softmax + bmm).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine_config import FIRST_ID, MODEL

from llm_inference.engine.api import SamplingOptions
from llm_inference.engine.config import EngineConfig
from llm_inference.engine.core import EngineCore
from llm_inference.engine.scheduler import ScheduledChunk
from llm_inference.engine.sequence import Sequence as EngineSeq

WARMUP, TIMED = 2, 6


def bench_decode_steps(
    model_dir: Path, contexts: Sequence[int], batch: int, kv_bytes: int
) -> dict[str, Any]:
    """Median decode-step ms per context length (those the model allows) for both backends."""
    config = EngineConfig(kv_cache_memory_bytes=kv_bytes, enable_prefix_caching=False)
    results: dict[str, list[float]] = {}
    usable: list[int] = []
    for backend in ("paged", "gather"):
        core = EngineCore.from_checkpoint(
            model_dir, replace(config, attention_backend=backend), MODEL
        )
        if core.runner.attention_backend != backend:
            return {"skipped": f"{backend} attention unavailable here"}
        usable = [c for c in contexts if c < core.max_context]
        results[backend] = [_step_ms(core, ctx, batch) for ctx in usable]
    return {
        "batch": batch,
        "contexts": usable,
        "paged_ms": results["paged"],
        "gather_ms": results["gather"],
        "gather_over_paged": [
            g / p for g, p in zip(results["gather"], results["paged"], strict=True)
        ],
    }


def step_rows_ms(core: EngineCore, rows: Sequence[int], context: int = 256) -> dict[str, float]:
    """Decode step ms for each row count (rows of distinct sequences at one context)."""
    return {str(n): _step_ms(core, context, n) for n in rows}


def _step_ms(core: EngineCore, context: int, batch: int) -> float:
    manager = core.block_manager
    chunks = []
    for i in range(batch):
        tokens = [FIRST_ID + (i + j) % 97 for j in range(context)]
        seq = EngineSeq(f"d{context}-{i}", tokens, context - 1, SamplingOptions(), 1)
        manager.grow(seq, context)
        seq.num_computed_tokens = context - 1
        chunks.append(ScheduledChunk(seq, context - 1, 1))
    times = []
    for n in range(WARMUP + TIMED):
        start = time.perf_counter()
        core.runner.execute(chunks)
        if n >= WARMUP:
            times.append((time.perf_counter() - start) * 1e3)
    for chunk in chunks:
        manager.free(chunk.seq)
    return statistics.median(times)
