"""bench_engine's engine runs: requests at once (burst) or one after another (sequential)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

from engine_config import FIRST_ID, KV_BUDGET, MODEL
from engine_values import Request, RunResult
from engine_workloads import greedy

from llm_inference.engine.api import FinishReason, TokenEvent
from llm_inference.engine.config import EngineConfig
from llm_inference.engine.engine import AsyncEngine


async def consume(engine: AsyncEngine, request_id: str, request: Request) -> TokenEvent:
    last: TokenEvent | None = None
    count = 0
    async for event in engine.generate(request_id, request.prompt, greedy(request.max_tokens)):
        count += len(event.token_ids)
        last = event
    if last is None or last.finish_reason is not FinishReason.LENGTH or count != request.max_tokens:
        raise RuntimeError(f"{request_id}: {count} tokens, last event {last}")
    return last


async def run_burst(engine: AsyncEngine, requests: Sequence[Request], tag: str) -> RunResult:
    """All requests submitted at once; wall time until the last one finishes."""
    start, cpu = time.perf_counter(), time.process_time()
    finals = await asyncio.gather(
        *(consume(engine, f"{tag}-{i}", r) for i, r in enumerate(requests))
    )
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    ttft = [f.timings.ttft_ms for f in finals if f.timings is not None]
    return RunResult(sum(r.max_tokens for r in requests), seconds, cpu, ttft)


async def run_sequential(engine: AsyncEngine, requests: Sequence[Request], tag: str) -> RunResult:
    start, cpu = time.perf_counter(), time.process_time()
    ttft = []
    for i, request in enumerate(requests):
        final = await consume(engine, f"{tag}-{i}", request)
        if final.timings is not None:
            ttft.append(final.timings.ttft_ms)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return RunResult(sum(r.max_tokens for r in requests), seconds, cpu, ttft)


def engine_config(prefix_caching: bool = True) -> EngineConfig:
    return EngineConfig(kv_cache_memory_bytes=KV_BUDGET, enable_prefix_caching=prefix_caching)


async def with_engine(model_dir: Path, config: EngineConfig) -> AsyncEngine:
    engine = AsyncEngine.from_checkpoint(model_dir, config, MODEL)
    await engine.start()
    await run_sequential(engine, [Request(list(range(FIRST_ID, 40)), 4)], "warmup")
    return engine


async def bench_throughput(model_dir: Path, requests: Sequence[Request]) -> RunResult:
    engine = await with_engine(model_dir, engine_config())
    try:
        return await run_burst(engine, requests, "tput")
    finally:
        await engine.stop()
