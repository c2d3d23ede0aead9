"""The TensorRT-LLM adapter against the real API's recorded signatures (trtllm_real_api.py):
the stand-in mirrors them, and every name the adapter passes or reads on a real run path exists
in the real LLM / RequestOutput / CompletionOutput / SamplingParams / KvCacheConfig. Also the
two features the recorded release added: cached_tokens from KV block reuse, and priority."""

from __future__ import annotations

import dataclasses
import inspect
from collections import defaultdict
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from llm_inference.backends.trtllm import TrtLlmBackend
from llm_inference.backends.trtllm_params import trt_priority
from llm_inference.engine.api import FormatKind, OutputFormatSpec, SamplingOptions, TokenEvent

from . import trtllm_real_api as real
from .trtllm_fake import install_fake_tensorrt_llm, remove_fake_tensorrt_llm, write_checkpoint
from .trtllm_fake import trtllm_config as config

Log = defaultdict[str, set[str]]


@pytest.fixture
def trt(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    yield install_fake_tensorrt_llm(monkeypatch)
    remove_fake_tensorrt_llm()


def _params(function: Callable[..., Any]) -> list[str]:
    kinds = (inspect.Parameter.VAR_KEYWORD, inspect.Parameter.VAR_POSITIONAL)
    names = inspect.signature(function).parameters.values()
    return [p.name for p in names if p.name != "self" and p.kind not in kinds]


def test_the_stand_in_mirrors_the_recorded_signatures(trt: ModuleType) -> None:
    assert tuple(_params(trt.LLM.__init__)) == real.LLM_INIT
    assert trt._LLM_KWARGS <= real.LLM_ARGS
    assert tuple(_params(trt.LLM.generate_async)) == real.GENERATE_ASYNC
    default = inspect.signature(trt.LLM.generate_async).parameters["priority"].default
    assert default == real.DEFAULT_REQUEST_PRIORITY
    public = {n for n, _ in inspect.getmembers(trt.LLM) if not n.startswith("_")}
    assert public <= real.LLM_METHODS
    sampling = tuple(f.name for f in dataclasses.fields(trt.SamplingParams))
    assert sampling == real.SAMPLING_PARAMS
    guided = tuple(f.name for f in dataclasses.fields(trt.GuidedDecodingParams))
    assert guided == real.GUIDED_DECODING_PARAMS
    assert {f.name for f in dataclasses.fields(trt.llmapi.KvCacheConfig)} <= real.KV_CACHE_CONFIG
    completion = [f.name for f in dataclasses.fields(trt.CompletionOutput) if f.name[0] != "_"]
    assert tuple(completion) == real.COMPLETION_OUTPUT_FIELDS


def test_the_request_output_has_only_real_attributes(trt: ModuleType, tmp_path: Path) -> None:
    llm = trt.LLM(str(write_checkpoint(tmp_path)))
    result = llm.generate_async([5, 6], trt.SamplingParams(max_tokens=2), streaming=True)
    public = {n for n in dir(result) if not n.startswith("_")}
    assert public <= real.REQUEST_OUTPUT
    assert {n for n in dir(result.outputs[0]) if not n.startswith("_")} <= real.COMPLETION_OUTPUT


class _Recorded:
    """A proxy that logs every attribute read on `target` under `kind`."""

    def __init__(self, target: Any, kind: str, log: Log) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_log", log)

    def __getattr__(self, name: str) -> Any:
        self._log[self._kind].add(name)
        value = getattr(self._target, name)
        if name == "outputs":
            return [_Recorded(o, "CompletionOutput", self._log) for o in value]
        if name == "generate_async":
            return self._generate_async
        return value

    def _generate_async(self, *args: Any, **kwargs: Any) -> _RecordedResult:
        self._log["generate_async"].update(kwargs)
        result = self._target.generate_async(*args, **kwargs)
        return _RecordedResult(result, "RequestOutput", self._log)


class _RecordedResult(_Recorded):
    """The streaming result: `async for` yields the same (recorded) object, updated."""

    def __aiter__(self) -> _RecordedResult:
        return self

    async def __anext__(self) -> _RecordedResult:
        await self._target.__anext__()
        return self


def _recording_module(trt: ModuleType, log: Log, monkeypatch: pytest.MonkeyPatch) -> Any:
    def constructor(cls: type, kind: str, wrap: bool = False) -> Callable[..., Any]:
        def build(*args: Any, **kwargs: Any) -> Any:
            log[kind].update(kwargs)
            made = cls(*args, **kwargs)
            return _Recorded(made, kind, log) if wrap else made

        return build

    llmapi = trt.llmapi
    monkeypatch.setattr(llmapi, "KvCacheConfig", constructor(llmapi.KvCacheConfig, "KvCacheConfig"))
    guided = constructor(llmapi.GuidedDecodingParams, "GuidedDecodingParams")
    monkeypatch.setattr(llmapi, "GuidedDecodingParams", guided)
    return SimpleNamespace(
        LLM=constructor(trt.LLM, "LLM", wrap=True),
        SamplingParams=constructor(trt.SamplingParams, "SamplingParams"),
    )


async def _drain(stream: AsyncIterator[TokenEvent]) -> list[TokenEvent]:
    return [event async for event in stream]


async def test_the_adapter_uses_only_names_the_real_api_has(
    trt: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: Log = defaultdict(set)
    module = _recording_module(trt, log, monkeypatch)
    backend = TrtLlmBackend(config(write_checkpoint(tmp_path)), module=module)
    await backend.start()
    try:
        rich = SamplingOptions(
            temperature=0.0, max_tokens=4, ignore_eos=True, top_logprobs=2,
            stop_strings=("w63",), logit_bias=((3, 1.0),),
            output_format=OutputFormatSpec(FormatKind.REGEX, "w[0-9]+"),
        )  # fmt: skip
        await _drain(backend.generate("a", [5, 6, 7], rich, priority=3))
        stream = backend.generate("b", [5, 6], SamplingOptions(max_tokens=50, ignore_eos=True))
        await anext(aiter(stream))
        backend.abort("b")
        await _drain(stream)
        backend.load()
    finally:
        await backend.stop()
    tables = {
        "LLM": set(real.LLM_INIT) | real.LLM_ARGS | real.LLM_METHODS,
        "generate_async": set(real.GENERATE_ASYNC),
        "RequestOutput": real.REQUEST_OUTPUT,
        "CompletionOutput": real.COMPLETION_OUTPUT,
        "SamplingParams": set(real.SAMPLING_PARAMS),
        "KvCacheConfig": real.KV_CACHE_CONFIG,
        "GuidedDecodingParams": set(real.GUIDED_DECODING_PARAMS),
    }
    assert set(log) <= set(tables), set(log) - set(tables)
    for kind, names in log.items():
        assert names <= tables[kind], f"{kind}: {sorted(names - tables[kind])} not in the real API"
    # The run touched what it is meant to check (a vacuous log would pass the loop above).
    assert {"priority", "streaming", "sampling_params"} <= log["generate_async"]
    assert {"cached_tokens", "outputs", "finished", "abort"} <= log["RequestOutput"]
    assert {"token_ids_diff", "logprobs_diff"} <= log["CompletionOutput"]
    assert {"enable_block_reuse", "free_gpu_memory_fraction"} <= log["KvCacheConfig"]


async def test_cached_tokens_come_from_kv_block_reuse(trt: ModuleType, tmp_path: Path) -> None:
    backend = TrtLlmBackend(config(write_checkpoint(tmp_path)))
    await backend.start()
    try:
        prompt = [(7 * i) % 60 + 2 for i in range(70)]  # two full 32-token blocks and 6 more
        sampling = SamplingOptions(temperature=0.0, max_tokens=3, ignore_eos=True)
        first = (await _drain(backend.generate("r1", prompt, sampling)))[-1]
        again = (await _drain(backend.generate("r2", prompt, sampling)))[-1]
        other = (await _drain(backend.generate("r3", [9, *prompt], sampling)))[-1]
    finally:
        await backend.stop()
    assert first.cached_tokens == 0
    assert again.cached_tokens == 64  # the two full blocks; the tail is recomputed
    assert other.cached_tokens == 0  # a different first block shares nothing


async def test_without_block_reuse_nothing_is_cached(trt: ModuleType, tmp_path: Path) -> None:
    backend = TrtLlmBackend(config(write_checkpoint(tmp_path), enable_block_reuse=False))
    await backend.start()
    try:
        prompt = list(range(2, 40))
        sampling = SamplingOptions(max_tokens=2, ignore_eos=True)
        await _drain(backend.generate("r1", prompt, sampling))
        again = (await _drain(backend.generate("r2", prompt, sampling)))[-1]
    finally:
        await backend.stop()
    assert again.cached_tokens == 0


async def test_priority_reaches_generate_async_in_range_and_order(
    trt: ModuleType, tmp_path: Path
) -> None:
    backend = TrtLlmBackend(config(write_checkpoint(tmp_path)))
    await backend.start()
    try:
        for i, priority in enumerate((0, 5, -5, 1 << 30, -(1 << 30))):
            sampling = SamplingOptions(max_tokens=1, ignore_eos=True)
            await _drain(backend.generate(f"r{i}", [5, 6], sampling, priority=priority))
        given = backend._llm.priorities
    finally:
        await backend.stop()
    assert given[0] == real.DEFAULT_REQUEST_PRIORITY  # our default is theirs
    assert given[4] < given[2] < given[0] < given[1] < given[3]
    assert all(0.0 <= p <= 1.0 for p in given)


def test_priority_mapping_keeps_order_and_distinguishes_small_values() -> None:
    values = [trt_priority(p) for p in range(-16, 17)]
    assert values == sorted(values)
    assert len(set(values)) == len(values)
    assert trt_priority(0) == 0.5
