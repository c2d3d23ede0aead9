"""AsyncEngine on the demo checkpoint: streaming, text, stop conditions, cancellation, bad input."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from llm_inference.engine.api import (
    EngineError,
    FinishReason,
    InvalidRequest,
    SamplingOptions,
    TokenEvent,
)
from llm_inference.engine.config import EngineConfig
from llm_inference.engine.engine import AsyncEngine

PROMPT = [0, 17, 942, 311, 1200, 87, 3021, 45, 999, 12, 640, 2048]
GREEDY = SamplingOptions(temperature=0.0, max_tokens=40, ignore_eos=True)


@pytest.fixture
async def engine(demo_model_dir: Path) -> AsyncIterator[AsyncEngine]:
    config = EngineConfig(kv_cache_memory_bytes=16 << 20, max_num_seqs=8, max_batched_tokens=256)
    engine = AsyncEngine.from_checkpoint(demo_model_dir, config, "demo-llama")
    await engine.start()
    yield engine
    await engine.stop()


async def _collect(events: AsyncIterator[TokenEvent]) -> list[TokenEvent]:
    return [event async for event in events]


async def _until_blocks_free(engine: AsyncEngine) -> None:
    for _ in range(200):
        load = engine.load()
        if load.kv_blocks_free == load.kv_blocks_total and load.num_running == 0:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"blocks not freed: {engine.load()}")


async def test_stream_carries_tokens_text_usage_and_timings(
    engine: AsyncEngine, demo_model_dir: Path
) -> None:
    events = await _collect(engine.generate("r1", PROMPT, GREEDY))
    tokens = [t for e in events for t in e.token_ids]
    assert len(tokens) == 40
    assert all(e.finish_reason is None and e.timings is None for e in events[:-1])
    last = events[-1]
    assert last.finish_reason is FinishReason.LENGTH
    assert (last.prompt_tokens, last.completion_tokens) == (len(PROMPT), 40)
    assert last.timings is not None
    assert last.timings.ttft_ms > 0
    assert last.timings.decode_ms > 0
    tokenizer = Tokenizer.from_file(str(demo_model_dir / "tokenizer.json"))
    text = "".join(e.text_delta for e in events)
    assert text == tokenizer.decode(tokens, skip_special_tokens=True)
    assert engine.info().model == "demo-llama"
    assert engine.info().backend == "torch"


async def test_stop_string_ends_generation_and_is_not_returned(engine: AsyncEngine) -> None:
    full = "".join(e.text_delta for e in await _collect(engine.generate("a", PROMPT, GREEDY)))
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    options = SamplingOptions(temperature=0.0, max_tokens=40, ignore_eos=True, stop_strings=(stop,))
    events = await _collect(engine.generate("b", PROMPT, options))
    assert events[-1].finish_reason is FinishReason.STOP
    assert "".join(e.text_delta for e in events) == full[: full.index(stop)]


async def test_stop_token_id_ends_generation(engine: AsyncEngine) -> None:
    tokens = [t for e in await _collect(engine.generate("a", PROMPT, GREEDY)) for t in e.token_ids]
    stop_id = tokens[6]
    options = SamplingOptions(temperature=0.0, max_tokens=40, stop_token_ids=(stop_id,))
    events = await _collect(engine.generate("b", PROMPT, options))
    got = [t for e in events for t in e.token_ids]
    assert got == tokens[: tokens.index(stop_id) + 1]
    assert events[-1].finish_reason is FinishReason.STOP


async def test_logprobs_are_returned_per_token(engine: AsyncEngine) -> None:
    options = SamplingOptions(temperature=0.8, seed=3, max_tokens=10, logprobs=True)
    events = await _collect(engine.generate("lp", PROMPT, options))
    logprobs = [lp for e in events for lp in (e.logprobs or ())]
    assert len(logprobs) == sum(len(e.token_ids) for e in events)
    assert all(lp <= 0.0 for lp in logprobs)


async def test_abort_ends_stream_cancelled_and_frees_blocks(engine: AsyncEngine) -> None:
    options = SamplingOptions(temperature=0.0, max_tokens=500, ignore_eos=True)
    stream = engine.generate("long", PROMPT * 10, options)
    first = await anext(stream)
    assert first.finish_reason is None
    assert engine.load().kv_blocks_free < engine.load().kv_blocks_total
    engine.abort("long")
    rest = [e async for e in stream]
    assert rest[-1].finish_reason is FinishReason.CANCELLED
    await _until_blocks_free(engine)
    engine.abort("long")  # idempotent


async def test_closing_the_stream_aborts_the_request(engine: AsyncEngine) -> None:
    options = SamplingOptions(temperature=0.0, max_tokens=500, ignore_eos=True)
    stream = engine.generate("closed", PROMPT, options)
    await anext(stream)
    await stream.aclose()
    await _until_blocks_free(engine)

    async def consume() -> None:
        async for _ in engine.generate("task", PROMPT, options):
            pass

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _until_blocks_free(engine)


@pytest.mark.parametrize(
    ("prompt", "options", "message"),
    [
        ([], GREEDY, "empty"),
        ([5] * 5000, GREEDY, "context"),
        ([1, 2, 99999], GREEDY, "prompt_token_ids"),
        (PROMPT, SamplingOptions(temperature=-1.0), "temperature"),
        (PROMPT, SamplingOptions(top_p=0.0), "top_p"),
        (PROMPT, SamplingOptions(max_tokens=0), "max_tokens"),
        (PROMPT, SamplingOptions(stop_strings=("",)), "stop_strings"),
    ],
)
async def test_bad_requests_are_rejected_and_engine_keeps_serving(
    engine: AsyncEngine, prompt: list[int], options: SamplingOptions, message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message):
        await _collect(engine.generate("bad", prompt, options))
    events = await _collect(engine.generate("good", PROMPT, SamplingOptions(max_tokens=3)))
    assert events[-1].finish_reason in (FinishReason.LENGTH, FinishReason.STOP)


async def test_duplicate_request_id_is_rejected(engine: AsyncEngine) -> None:
    options = SamplingOptions(temperature=0.0, max_tokens=200, ignore_eos=True)
    stream = engine.generate("dup", PROMPT, options)
    await anext(stream)
    with pytest.raises(InvalidRequest, match="already running"):
        await _collect(engine.generate("dup", PROMPT, options))
    await stream.aclose()


async def test_concurrent_streams_and_load_snapshot(engine: AsyncEngine) -> None:
    options = SamplingOptions(temperature=0.0, max_tokens=30, ignore_eos=True)
    results = await asyncio.gather(
        *(_collect(engine.generate(f"c{i}", PROMPT[: 4 + i], options)) for i in range(12))
    )
    assert all(sum(len(e.token_ids) for e in r) == 30 for r in results)
    load = engine.load()
    assert load.num_waiting == 0
    assert load.num_running == 0
    assert load.kv_blocks_free == load.kv_blocks_total
    assert load.tokens_per_second > 0
    assert load.max_num_seqs == 8


async def test_generate_before_start_is_an_engine_error(demo_model_dir: Path) -> None:
    engine = AsyncEngine.from_checkpoint(
        demo_model_dir, EngineConfig(kv_cache_memory_bytes=4 << 20), "demo"
    )
    with pytest.raises(EngineError, match="not running"):
        await _collect(engine.generate("x", PROMPT, GREEDY))


async def test_stop_ends_in_flight_streams_with_error(engine: AsyncEngine) -> None:
    options = SamplingOptions(temperature=0.0, max_tokens=1000, ignore_eos=True)
    stream = engine.generate("running", PROMPT, options)
    await anext(stream)
    await engine.stop()
    rest = [e async for e in stream]
    assert rest[-1].finish_reason is FinishReason.ERROR
    with pytest.raises(EngineError, match="not running"):
        await _collect(engine.generate("after", PROMPT, options))
