"""AsyncEngine with output formats: compiling happens off the event loop and the engine thread,
before anything is queued; a slow compile holds back only its own request."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llm_inference.engine.api import (
    FinishReason,
    FormatKind,
    InvalidRequest,
    OutputFormatSpec,
    SamplingOptions,
    TokenEvent,
)
from llm_inference.engine.config import EngineConfig
from llm_inference.engine.engine import AsyncEngine

PROMPT = [0, 17, 942, 311, 1200, 87, 3021, 45]
FREE = SamplingOptions(temperature=0.0, max_tokens=8, ignore_eos=True)


@pytest.fixture
async def engine(demo_model_dir: Path) -> AsyncIterator[AsyncEngine]:
    config = EngineConfig(kv_cache_memory_bytes=16 << 20, max_num_seqs=8, max_batched_tokens=256)
    engine = AsyncEngine.from_checkpoint(demo_model_dir, config, "demo-llama")
    await engine.start()
    yield engine
    await engine.stop()


def slow_format(fields: int = 600) -> OutputFormatSpec:
    """A schema that takes xgrammar most of a second to compile on the demo vocabulary."""
    names = [f"k{i}" for i in range(fields)]
    stamp = {"type": "string", "format": "date-time"}
    schema = {"type": "object", "properties": dict.fromkeys(names, stamp), "required": names}
    return OutputFormatSpec(FormatKind.JSON_SCHEMA, json.dumps(schema))


async def collect(stream: AsyncIterator[TokenEvent]) -> list[TokenEvent]:
    return [event async for event in stream]


async def handed_off(engine: AsyncEngine) -> None:
    """Until a compilation was submitted (polled: the cache has no event to wait on)."""
    for _ in range(10_000):
        if engine.core.grammars.stats.misses:
            return
        await asyncio.sleep(0.001)
    raise AssertionError("no compilation started")


async def first_event_at(stream: AsyncIterator[TokenEvent]) -> float:
    await anext(stream)
    at = time.perf_counter()
    await collect(stream)
    return at


async def test_a_compiling_request_does_not_delay_others(engine: AsyncEngine) -> None:
    options = SamplingOptions(temperature=0.0, max_tokens=4, output_format=slow_format())
    constrained = asyncio.create_task(first_event_at(engine.generate("slow", PROMPT, options)))
    await handed_off(engine)
    events = await collect(engine.generate("free", PROMPT, FREE))
    free_done = time.perf_counter()
    assert events[-1].finish_reason is FinishReason.LENGTH
    assert not constrained.done()
    assert await constrained > free_done


async def test_concurrent_requests_share_one_compilation(engine: AsyncEngine) -> None:
    spec = OutputFormatSpec(FormatKind.CHOICE, choices=("alpha", "beta"))
    options = SamplingOptions(temperature=1.0, seed=1, max_tokens=8, output_format=spec)
    stats = engine.core.grammars.stats
    before = (stats.misses, stats.hits)
    results = await asyncio.gather(
        *(collect(engine.generate(f"c{i}", PROMPT, options)) for i in range(4))
    )
    assert (stats.misses - before[0], stats.hits - before[1]) == (1, 3)
    texts = {"".join(e.text_delta for e in events) for events in results}
    assert texts <= {"alpha", "beta"}
    assert all(events[-1].finish_reason is FinishReason.STOP for events in results)


async def test_abort_while_compiling_cancels_before_queueing(engine: AsyncEngine) -> None:
    options = SamplingOptions(max_tokens=4, output_format=slow_format(500))
    stream = engine.generate("gone", PROMPT, options)
    task = asyncio.create_task(collect(stream))
    await handed_off(engine)
    engine.abort("gone")
    events = await task
    assert [e.finish_reason for e in events] == [FinishReason.CANCELLED]
    assert events[0].completion_tokens == 0
    assert engine.load().num_running == 0


async def test_unsupported_schema_fails_before_queueing(engine: AsyncEngine) -> None:
    schema = {"type": "object", "properties": {"a": {"if": {}, "then": {}}}}
    options = SamplingOptions(
        output_format=OutputFormatSpec(FormatKind.JSON_SCHEMA, json.dumps(schema))
    )
    with pytest.raises(InvalidRequest) as caught:
        await collect(engine.generate("bad", PROMPT, options))
    assert str(caught.value).startswith('unsupported keyword "if" at $.properties.a')
    assert caught.value.field == "sampling.format.json_schema"
    assert engine.load().num_waiting == 0
    events = await collect(engine.generate("after", PROMPT, FREE))
    assert events[-1].finish_reason is FinishReason.LENGTH
