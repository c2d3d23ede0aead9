"""The GPU benchmark's engine runs: N greedy requests submitted at once, tokens and timings."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from llm_inference.engine.api import SamplingOptions
from llm_inference.engine.config import Device, EngineConfig
from llm_inference.engine.engine import AsyncEngine

FIRST_ID = 3  # below: bos/eos/pad of the random checkpoint's config


@dataclass(frozen=True, slots=True)
class Request:
    prompt: list[int]
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Output:
    token_ids: list[int]
    ttft_ms: float
    decode_ms: float

    @property
    def step_ms(self) -> float:
        """Mean time between this request's tokens after the first (its decode steps)."""
        return self.decode_ms / max(len(self.token_ids) - 1, 1)


@dataclass(frozen=True, slots=True)
class BatchRun:
    outputs: list[Output]
    seconds: float

    @property
    def output_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def median_step_ms(self) -> float:
        return statistics.median(o.step_ms for o in self.outputs)


def random_requests(
    count: int, prompt_len: int, max_tokens: int, vocab: int, seed: int
) -> list[Request]:
    rng = random.Random(seed)
    return [
        Request([rng.randrange(FIRST_ID, vocab) for _ in range(prompt_len)], max_tokens)
        for _ in range(count)
    ]


def engine_config(
    device: Device, kv_bytes: int, max_seqs: int, cuda_graphs: bool = False
) -> EngineConfig:
    return EngineConfig(
        cuda_graphs=cuda_graphs,
        dtype="bfloat16",
        device=device,
        kv_cache_memory_bytes=kv_bytes,
        max_num_seqs=max_seqs,
        max_batched_tokens=4096,
        enable_prefix_caching=False,  # random prompts share nothing; keep the path plain
    )


def greedy(max_tokens: int) -> SamplingOptions:
    return SamplingOptions(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False
    )


async def _one(engine: AsyncEngine, request_id: str, request: Request) -> Output:
    tokens: list[int] = []
    ttft_ms = decode_ms = 0.0
    async for event in engine.generate(request_id, request.prompt, greedy(request.max_tokens)):
        tokens.extend(event.token_ids)
        if event.timings is not None:
            ttft_ms, decode_ms = event.timings.ttft_ms, event.timings.decode_ms
    if len(tokens) != request.max_tokens:
        raise RuntimeError(f"{request_id}: {len(tokens)} of {request.max_tokens} tokens")
    return Output(tokens, ttft_ms, decode_ms)


async def run_batch(engine: AsyncEngine, requests: Sequence[Request], tag: str) -> BatchRun:
    """All requests at once; wall time until the last finishes."""
    start = time.perf_counter()
    outputs = await asyncio.gather(*(_one(engine, f"{tag}-{i}", r) for i, r in enumerate(requests)))
    return BatchRun(list(outputs), time.perf_counter() - start)


async def start_engine(model_dir: Path, config: EngineConfig) -> AsyncEngine:
    engine = AsyncEngine.from_checkpoint(model_dir, config, model_dir.name)
    await engine.start()
    await run_batch(engine, [Request(list(range(FIRST_ID, FIRST_ID + 8)), 4)], "warmup")
    return engine
