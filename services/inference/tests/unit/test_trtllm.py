"""The TensorRT-LLM adapter against a stand-in `tensorrt_llm` package (tests/fakes) that mirrors
the documented LLM API; no test here touches a GPU or the real package. The sampling mapping
itself is covered in test_trtllm_params.py."""

from __future__ import annotations

import asyncio
import math
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from llm_common.config import ConfigError
from llm_inference.backends.trtllm import TrtLlmBackend, import_tensorrt_llm
from llm_inference.engine.api import (
    FinishReason,
    FormatKind,
    InvalidRequest,
    OutputFormatSpec,
    SamplingOptions,
    TokenEvent,
    TopToken,
)

from .trtllm_fake import (
    EOS,
    VOCAB,
    install_fake_tensorrt_llm,
    remove_fake_tensorrt_llm,
    toy_greedy,
    toy_logprobs,
    write_checkpoint,
)
from .trtllm_fake import trtllm_config as config


@pytest.fixture
def trt(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The stand-in installed as `tensorrt_llm` (+ submodules), removed again after the test."""
    yield install_fake_tensorrt_llm(monkeypatch)
    remove_fake_tensorrt_llm()


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path)


@pytest.fixture
async def backend(trt: ModuleType, checkpoint: Path) -> AsyncIterator[TrtLlmBackend]:
    adapter = TrtLlmBackend(config(checkpoint))
    await adapter.start()
    yield adapter
    await adapter.stop()


async def collect(stream: AsyncIterator[TokenEvent]) -> list[TokenEvent]:
    return [event async for event in stream]


def test_missing_package_is_a_clear_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)  # makes the import fail
    with pytest.raises(ConfigError, match="INFERENCE_BACKEND: tensorrt_llm needs the"):
        import_tensorrt_llm()


async def test_llm_is_built_with_parallelism_kv_config_and_limits(
    backend: TrtLlmBackend, trt: ModuleType
) -> None:
    llm = backend._llm
    assert isinstance(llm, trt.LLM)
    args = llm.args
    assert (args["tensor_parallel_size"], args["pipeline_parallel_size"]) == (2, 2)
    assert (args["max_batch_size"], args["max_num_tokens"], args["max_seq_len"]) == (8, 256, 128)
    assert args["enable_iter_perf_stats"] is True
    assert args["guided_decoding_backend"] == "xgrammar"  # constrained decoding is on by default
    kv = args["kv_cache_config"]
    assert isinstance(kv, trt.llmapi.KvCacheConfig)
    assert kv.enable_block_reuse is True
    assert kv.free_gpu_memory_fraction == 0.5
    info = backend.info()
    assert (info.backend, info.model, info.max_context) == ("tensorrt_llm", "toy", 128)
    assert (info.kv_block_size, info.kv_blocks_total) == (32, 64)


def test_sampling_params_mapping(trt: ModuleType, checkpoint: Path) -> None:
    adapter = TrtLlmBackend(config(checkpoint))
    options = SamplingOptions(
        temperature=0.7, top_p=0.9, top_k=0, max_tokens=12, seed=5, stop_token_ids=(3,),
        stop_strings=("w9",), ignore_eos=True, logprobs=True,
    )  # fmt: skip
    params = adapter.sampling_params(options)
    assert isinstance(params, trt.SamplingParams)
    assert (params.temperature, params.top_p, params.top_k) == (0.7, 0.9, None)
    assert (params.max_tokens, params.seed, params.ignore_eos) == (12, 5, True)
    assert (params.stop, params.stop_token_ids) == (["w9"], [3])
    assert params.include_stop_str_in_output is False
    assert params.logprobs == 1
    assert params.detokenize is True  # stop strings are matched on text
    assert params.end_id is None  # set from the checkpoint's tokenizer by the LLM
    plain = adapter.sampling_params(SamplingOptions(top_k=5, detokenize=False))
    assert (plain.top_k, plain.stop, plain.stop_token_ids, plain.logprobs) == (5, None, None, None)
    assert plain.detokenize is False


async def test_streams_greedy_tokens_with_usage_and_timings(backend: TrtLlmBackend) -> None:
    prompt = [5, 6, 7]
    sampling = SamplingOptions(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=True)
    events = await collect(backend.generate("r1", prompt, sampling))
    tokens = [t for e in events for t in e.token_ids]
    assert tokens == toy_greedy(prompt, 6)
    assert "".join(e.text_delta for e in events) == " ".join(f"w{t}" for t in tokens)
    assert all(e.finish_reason is None for e in events[:-1])
    last = events[-1]
    assert last.finish_reason is FinishReason.LENGTH
    assert (last.prompt_tokens, last.completion_tokens) == (3, 6)
    assert last.timings is not None
    assert last.timings.ttft_ms > 0
    greedy_logprob, _ = toy_logprobs()
    assert [lp for e in events for lp in e.logprobs or ()] == pytest.approx([greedy_logprob] * 6)
    assert all(e.top_logprobs is None for e in events)  # not asked for


async def test_eos_stop_token_and_stop_string(backend: TrtLlmBackend) -> None:
    # A prompt whose greedy continuation reaches EOS after a few tokens.
    eos_prompt = next([x] for x in range(VOCAB) if EOS in toy_greedy([x], 12)[3:])
    continuation = toy_greedy(eos_prompt, 12)
    by_eos = await collect(
        backend.generate("e", eos_prompt, SamplingOptions(temperature=0.0, max_tokens=20))
    )
    assert [t for e in by_eos for t in e.token_ids] == continuation[: continuation.index(EOS)]
    assert by_eos[-1].finish_reason is FinishReason.STOP
    prompt = [5, 6, 7]
    expected = toy_greedy(prompt, 20)
    stop_id = expected[2]
    by_id = await collect(
        backend.generate(
            "a", prompt, SamplingOptions(temperature=0.0, max_tokens=20, stop_token_ids=(stop_id,))
        )
    )
    assert [t for e in by_id for t in e.token_ids] == expected[:2]
    assert by_id[-1].finish_reason is FinishReason.STOP
    stop = f"w{expected[3]}"
    by_text = await collect(
        backend.generate(
            "b", prompt, SamplingOptions(temperature=0.0, max_tokens=20, stop_strings=(stop,))
        )
    )
    text = "".join(e.text_delta for e in by_text)
    assert stop not in text
    assert by_text[-1].finish_reason is FinishReason.STOP


async def test_abort_ends_the_stream_cancelled_and_frees_blocks(backend: TrtLlmBackend) -> None:
    sampling = SamplingOptions(temperature=0.0, max_tokens=80, ignore_eos=True)
    stream = backend.generate("long", list(range(2, 40)), sampling)
    first = await anext(stream)
    assert first.token_ids
    await asyncio.sleep(0.05)  # let the stats poller see the running request
    busy = backend.load()
    assert busy.num_running == 1
    assert busy.kv_blocks_free < busy.kv_blocks_total
    assert busy.running_remaining_tokens > 0
    backend.abort("long")
    backend.abort("long")  # idempotent
    rest = [event async for event in stream]
    assert rest[-1].finish_reason is FinishReason.CANCELLED
    idle = backend.load()
    assert (idle.num_running, idle.kv_blocks_free, idle.kv_cache_usage) == (0, 64, 0.0)
    assert idle.tokens_per_second > 0


async def test_closing_the_stream_aborts_the_request(backend: TrtLlmBackend) -> None:
    sampling = SamplingOptions(temperature=0.0, max_tokens=100, ignore_eos=True)
    stream = backend.generate("closed", [3, 4], sampling)
    await anext(stream)
    request = backend._requests["closed"]
    await stream.aclose()  # type: ignore[attr-defined]
    assert request.result.aborted()
    assert "closed" not in backend._requests


async def test_seeded_sampling_is_reproducible(backend: TrtLlmBackend) -> None:
    sampling = SamplingOptions(temperature=1.0, max_tokens=8, seed=11, ignore_eos=True)
    first = await collect(backend.generate("s1", [3], sampling))
    second = await collect(backend.generate("s2", [3], sampling))
    assert [e.token_ids for e in first] == [e.token_ids for e in second]


async def test_argument_errors_are_invalid_requests(backend: TrtLlmBackend) -> None:
    too_long = SamplingOptions(max_tokens=200)
    with pytest.raises(InvalidRequest, match="max_seq_len"):
        await collect(backend.generate("x", [1, 2], too_long))


async def test_unknown_llm_arguments_are_rejected(trt: ModuleType, checkpoint: Path) -> None:
    with pytest.raises(ValueError, match="got invalid argument"):
        trt.LLM(model=str(checkpoint), not_an_argument=1)


async def test_releases_without_finish_reason_still_finish_right(
    backend: TrtLlmBackend, trt: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    finish = trt.RequestOutput._finish

    def finish_without_reason(self: object, reason: str, stop_reason: object = None) -> None:
        finish(self, reason, stop_reason)
        self.outputs[0].finish_reason = None  # type: ignore[attr-defined]

    monkeypatch.setattr(trt.RequestOutput, "_finish", finish_without_reason)
    prompt = [5, 6, 7]
    by_length = await collect(
        backend.generate(
            "l", prompt, SamplingOptions(temperature=0.0, max_tokens=4, ignore_eos=True)
        )
    )
    assert by_length[-1].finish_reason is FinishReason.LENGTH
    stop_id = toy_greedy(prompt, 3)[2]
    sampling = SamplingOptions(temperature=0.0, max_tokens=20, stop_token_ids=(stop_id,))
    by_stop = await collect(backend.generate("s", prompt, sampling))
    assert by_stop[-1].finish_reason is FinishReason.STOP


async def test_without_constrained_decoding_formats_are_invalid(
    trt: ModuleType, checkpoint: Path
) -> None:
    adapter = TrtLlmBackend(config(checkpoint, constrained_decoding=False))
    await adapter.start()
    try:
        assert "guided_decoding_backend" not in adapter._llm.args
        sampling = SamplingOptions(output_format=OutputFormatSpec(FormatKind.JSON_OBJECT))
        with pytest.raises(InvalidRequest) as caught:
            await collect(adapter.generate("f", [1, 2], sampling))
        assert caught.value.field == "sampling.format"
        assert not adapter._requests
    finally:
        await adapter.stop()


async def test_top_logprobs_stream_most_likely_first(backend: TrtLlmBackend) -> None:
    prompt = [5, 6, 7]
    sampling = SamplingOptions(temperature=0.0, max_tokens=4, ignore_eos=True, top_logprobs=3)
    events = await collect(backend.generate("t", prompt, sampling))
    tokens = [t for e in events for t in e.token_ids]
    chosen = [lp for e in events for lp in e.logprobs or ()]
    top = [alternatives for e in events for alternatives in e.top_logprobs or ()]
    assert tokens == toy_greedy(prompt, 4)
    assert len(chosen) == len(top) == 4
    greedy, other = toy_logprobs()
    assert chosen == pytest.approx([greedy] * 4)
    for token, alternatives in zip(tokens, top, strict=True):
        assert [a.token_id for a in alternatives] == [
            token,
            *[t for t in (0, 1, 2) if t != token][:2],
        ]
        assert [a.logprob for a in alternatives] == pytest.approx([greedy, other, other])


async def test_sampled_token_outside_the_top_n_keeps_its_own_logprob(
    backend: TrtLlmBackend,
) -> None:
    sampling = SamplingOptions(
        temperature=1.0, seed=3, max_tokens=8, ignore_eos=True, top_logprobs=1
    )
    events = await collect(backend.generate("s", [3], sampling))
    tokens = [t for e in events for t in e.token_ids]
    chosen = [lp for e in events for lp in e.logprobs or ()]
    top = [alternatives for e in events for alternatives in e.top_logprobs or ()]
    history = [3, *tokens]
    greedy, other = toy_logprobs()
    for i, token in enumerate(tokens):  # the toy's most likely token depends on the history
        peak = (7 * history[i] + 3 * (i + 1)) % VOCAB
        assert top[i] == (TopToken(peak, pytest.approx(greedy)),)
        assert chosen[i] == pytest.approx(greedy if token == peak else other)
    assert any(t != (7 * history[i] + 3 * (i + 1)) % VOCAB for i, t in enumerate(tokens))


async def test_logit_bias_reaches_the_logits(backend: TrtLlmBackend) -> None:
    prompt = [5, 6, 7]
    first = toy_greedy(prompt, 1)[0]
    banned = SamplingOptions(temperature=0.0, max_tokens=1, logit_bias=((first, -100.0),))
    events = await collect(backend.generate("b", prompt, banned))
    assert events[-1].token_ids != (first,)
    forced = SamplingOptions(
        temperature=0.0, max_tokens=5, ignore_eos=True, logit_bias=((9, 50.0),), logprobs=True
    )
    events = await collect(backend.generate("f", prompt, forced))
    assert [t for e in events for t in e.token_ids] == [9] * 5
    assert events[0].logprobs is not None
    assert math.isclose(events[0].logprobs[0], 0.0, abs_tol=1e-9)  # 50 above the rest
