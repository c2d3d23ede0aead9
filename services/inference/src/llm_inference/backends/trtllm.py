"""TensorRT-LLM backend: the GenerationBackend interface over `tensorrt_llm.LLM`.

`tensorrt_llm` is imported only when this backend is built (INFERENCE_BACKEND=tensorrt_llm);
it needs an NVIDIA GPU image and is not a dependency of this package. The sampling mapping (and
the TensorRT-LLM sources it was checked against) is in trtllm_params.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from llm_common.config import ConfigError
from llm_common.logging import get_logger
from llm_inference.backends.trtllm_params import (
    MappingContext,
    StepLogprobs,
    build_sampling_params,
    checkpoint_vocab_size,
    step_logprobs,
    trt_priority,
)
from llm_inference.engine.api import (
    EngineError,
    EngineInfo,
    FinishReason,
    InvalidRequest,
    LoadSnapshot,
    RequestTimings,
    Resume,
    SamplingOptions,
    TokenEvent,
)
from llm_inference.rate import RateMeter

BACKEND_NAME = "tensorrt_llm"
_FINISH_REASONS = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "cancelled": FinishReason.CANCELLED,
    "timeout": FinishReason.CANCELLED,
}
_log = get_logger(__name__)


class BackendUnavailable(ConfigError):  # noqa: N818 - a configuration error, named for clarity
    """The selected backend cannot run here (its package is missing)."""


@dataclass(frozen=True, slots=True)
class TrtLlmConfig:
    """What the adapter passes to `tensorrt_llm.LLM` (and reports in Info)."""

    checkpoint: Path  # HF checkpoint directory (PyTorch backend) or a built engine directory
    model_name: str
    max_context: int  # -> max_seq_len
    dtype: str = "auto"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_num_seqs: int = 64  # -> max_batch_size
    max_batched_tokens: int = 2048  # -> max_num_tokens
    gpu_memory_fraction: float = 0.9  # -> KvCacheConfig.free_gpu_memory_fraction
    enable_block_reuse: bool = True  # prefix caching
    stats_interval_s: float = 0.5  # how often get_stats is polled for the load report
    # Output formats (JSON schema, regex, grammar, ...): builds the LLM with
    # guided_decoding_backend="xgrammar"; off, requests with a format are InvalidRequest.
    constrained_decoding: bool = True
    vocab_size: int | None = None  # logits width for logit_bias; None = checkpoint config.json


def import_tensorrt_llm() -> ModuleType:
    """The `tensorrt_llm` module, or a BackendUnavailable saying what is missing."""
    try:
        return importlib.import_module("tensorrt_llm")
    except ImportError as exc:
        raise BackendUnavailable.for_variable(
            "INFERENCE_BACKEND",
            "tensorrt_llm needs the `tensorrt_llm` package (NVIDIA TensorRT-LLM, CUDA images "
            f"only), which is not installed here ({exc}); use INFERENCE_BACKEND=torch",
        ) from exc


@dataclass(slots=True)
class _Request:
    """Adapter-side bookkeeping for one running request."""

    result: Any  # tensorrt_llm RequestOutput / GenerationResult
    prompt_tokens: int
    max_tokens: int
    top_logprobs: int = 0  # alternatives per token the caller asked for
    arrival: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    completion_tokens: int = 0
    cached_tokens: int = 0  # RequestOutput.cached_tokens: prompt tokens from reused KV blocks
    aborted: bool = False


class TrtLlmBackend:
    """GenerationBackend over `LLM.generate_async(..., streaming=True)`.

    Streams token deltas (`token_ids_diff`, `text_diff`), aborts with the result's `abort()`,
    and builds load reports from `get_stats()` (polled; its iterator must not be held) plus
    its own per-request bookkeeping.
    """

    def __init__(self, config: TrtLlmConfig, module: ModuleType | None = None) -> None:
        self._config = config
        self._trt = module if module is not None else import_tensorrt_llm()
        self._mapping = MappingContext(
            vocab_size=config.vocab_size or checkpoint_vocab_size(config.checkpoint),
            constrained_decoding=config.constrained_decoding,
        )
        self._llm: Any = None
        self._requests: dict[str, _Request] = {}
        self._stats: Mapping[str, Any] = {}
        self._capacity: Mapping[str, Any] = {}
        self._stats_task: asyncio.Task[None] | None = None
        self._tokens = RateMeter()

    async def start(self) -> None:
        """Build the LLM (loads weights, sizes the KV cache) and start polling its stats."""
        self._llm = await asyncio.to_thread(self._build_llm)
        capacity = getattr(self._llm, "get_kv_cache_capacity", None)
        if callable(capacity):
            self._capacity = dict(capacity())
        self._stats_task = asyncio.create_task(self._poll_stats(), name="trtllm-stats")

    def _build_llm(self) -> Any:
        llmapi = importlib.import_module("tensorrt_llm.llmapi")
        cfg = self._config
        kv_cache_config = llmapi.KvCacheConfig(
            enable_block_reuse=cfg.enable_block_reuse,
            free_gpu_memory_fraction=cfg.gpu_memory_fraction,
        )
        # BaseLlmArgs.guided_decoding_backend: Optional[Literal["xgrammar", "llguidance"]]
        guided = {"guided_decoding_backend": "xgrammar"} if cfg.constrained_decoding else {}
        return self._trt.LLM(
            model=str(cfg.checkpoint),
            tensor_parallel_size=cfg.tensor_parallel_size,
            pipeline_parallel_size=cfg.pipeline_parallel_size,
            dtype=cfg.dtype,
            kv_cache_config=kv_cache_config,
            max_batch_size=cfg.max_num_seqs,
            max_num_tokens=cfg.max_batched_tokens,
            max_seq_len=cfg.max_context,
            enable_iter_perf_stats=True,  # get_stats returns nothing without it
            **guided,
        )

    async def stop(self) -> None:
        if self._stats_task is not None:
            self._stats_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._stats_task
            self._stats_task = None
        for request_id in list(self._requests):
            self.abort(request_id)
        if self._llm is not None:
            await asyncio.to_thread(self._llm.shutdown)
            self._llm = None

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingOptions,
        priority: int = 0,
        resume: Resume | None = None,
    ) -> AsyncIterator[TokenEvent]:
        """Stream one request; closing this generator aborts it in TensorRT-LLM."""
        if self._llm is None:
            raise EngineError("the TensorRT-LLM backend is not started")
        if resume is not None:
            # TensorRT-LLM's sampler state cannot be keyed by position from here: a resumed
            # request would not continue the same answer, so it is refused (the router then
            # tries another replica or ends the stream).
            raise InvalidRequest("this backend cannot resume a request", "resume")
        if request_id in self._requests:
            raise InvalidRequest(f"request id {request_id!r} is already running")
        try:
            result = self._llm.generate_async(
                list(prompt_token_ids), sampling_params=self.sampling_params(sampling),
                streaming=True, priority=trt_priority(priority),
            )  # fmt: skip
        except ValueError as exc:  # argument checks (e.g. prompt + max_tokens > max_seq_len)
            raise InvalidRequest(str(exc)) from exc
        request = _Request(
            result, len(prompt_token_ids), sampling.max_tokens, sampling.top_logprobs
        )
        self._requests[request_id] = request
        finished = False
        try:
            async for output in result:
                event = self._event(request, output)
                finished = event.finish_reason is not None
                yield event
                if finished:
                    return
            # The stream ended without a finished output: only an abort does that.
            finished = True
            yield self._final(request, (), "", StepLogprobs(), _ended_reason(request))
        finally:
            self._requests.pop(request_id, None)
            if not finished and not request.aborted:
                request.result.abort()

    def abort(self, request_id: str) -> None:
        request = self._requests.get(request_id)
        if request is not None and not request.aborted:
            request.aborted = True
            request.result.abort()

    def sampling_params(self, sampling: SamplingOptions) -> Any:
        """`tensorrt_llm.SamplingParams` for `sampling` (end_id comes from the tokenizer);
        InvalidRequest (with its field) for what this deployment cannot serve."""
        llmapi = importlib.import_module("tensorrt_llm.llmapi")
        return build_sampling_params(self._trt, llmapi, sampling, self._mapping)

    def _event(self, request: _Request, output: Any) -> TokenEvent:
        completion = output.outputs[0]
        # Prompt tokens served from reused KV blocks (set once the context phase ran); releases
        # before PR #7637 have no such field.
        request.cached_tokens = int(getattr(output, "cached_tokens", 0) or 0)
        token_ids = tuple(int(t) for t in completion.token_ids_diff)
        now = time.perf_counter()
        if token_ids and request.first_token is None:
            request.first_token = now
        request.completion_tokens += len(token_ids)
        self._tokens.add(len(token_ids))
        logprobs = step_logprobs(completion, token_ids, request.top_logprobs)
        text = completion.text_diff or ""
        if not output.finished:
            return TokenEvent(
                token_ids=token_ids, text_delta=text, logprobs=logprobs.chosen,
                finish_reason=None, prompt_tokens=request.prompt_tokens,
                completion_tokens=request.completion_tokens, cached_tokens=request.cached_tokens,
                timings=None, top_logprobs=logprobs.top,
            )  # fmt: skip
        reason = _FINISH_REASONS.get(str(completion.finish_reason)) or _inferred_reason(request)
        return self._final(request, token_ids, text, logprobs, reason)

    def _final(
        self,
        request: _Request,
        token_ids: tuple[int, ...],
        text: str,
        logprobs: StepLogprobs,
        reason: FinishReason,
    ) -> TokenEvent:
        now = time.perf_counter()
        first = request.first_token if request.first_token is not None else now
        # TensorRT-LLM's streamed outputs carry no per-phase timings: queue time is not
        # observable here, so prefill is reported as the whole time to the first token.
        ttft_ms = (first - request.arrival) * 1e3
        timings = RequestTimings(
            queue_ms=0.0, prefill_ms=ttft_ms, ttft_ms=ttft_ms, decode_ms=(now - first) * 1e3
        )
        return TokenEvent(
            token_ids=token_ids, text_delta=text, logprobs=logprobs.chosen, finish_reason=reason,
            prompt_tokens=request.prompt_tokens, completion_tokens=request.completion_tokens,
            cached_tokens=request.cached_tokens, timings=timings, top_logprobs=logprobs.top,
        )  # fmt: skip

    async def _poll_stats(self) -> None:
        interval = self._config.stats_interval_s
        while True:
            try:
                entries = await asyncio.to_thread(self._llm.get_stats, interval)
            except Exception:  # stats are advisory: keep serving, retry next interval
                _log.warning("tensorrt_llm get_stats failed", exc_info=True)
                entries = []
            latest = _latest_stats(entries)
            if latest is not None:
                self._stats = latest
            await asyncio.sleep(interval)

    def load(self) -> LoadSnapshot:
        stats = self._stats if self._requests else {}  # idle: no iterations, stale stats
        kv = stats.get("kvCacheStats") or {}
        used = int(kv.get("usedNumBlocks", 0))
        total = self._kv_blocks_total(kv)
        free = int(kv.get("freeNumBlocks", max(total - used, 0)))
        inflight = stats.get("inflightBatchingStats") or {}
        running = int(inflight.get("numContextRequests", 0)) + int(
            inflight.get("numGenRequests", 0)
        )
        waiting = int(stats.get("numQueuedRequests", 0))
        if not stats:  # no stats yet: count from the adapter's own bookkeeping
            running = len(self._requests)
        return LoadSnapshot(
            num_waiting=waiting,
            num_running=running,
            kv_blocks_total=total,
            kv_blocks_free=free,
            kv_cache_usage=used / total if total else 0.0,
            waiting_prompt_tokens=sum(
                r.prompt_tokens for r in self._requests.values() if r.first_token is None
            ),
            running_remaining_tokens=sum(
                max(r.max_tokens - r.completion_tokens, 0) for r in self._requests.values()
            ),
            tokens_per_second=self._tokens.rate(),
            prefix_cache_hit_rate=float(kv.get("cacheHitRate", 0.0)),
            max_num_seqs=self._config.max_num_seqs,
        )

    def _kv_blocks_total(self, kv: Mapping[str, Any]) -> int:
        if "maxNumBlocks" in self._capacity:
            return int(self._capacity["maxNumBlocks"])
        if "maxNumBlocks" in kv:
            return int(kv["maxNumBlocks"])
        return int(kv.get("usedNumBlocks", 0)) + int(kv.get("freeNumBlocks", 0))

    def info(self) -> EngineInfo:
        cfg = self._config
        return EngineInfo(
            model=cfg.model_name,
            backend=BACKEND_NAME,
            dtype=cfg.dtype,
            device="cuda",
            max_context=cfg.max_context,
            kv_block_size=int(self._capacity.get("tokensPerBlock", 0)),
            kv_blocks_total=self._kv_blocks_total(self._stats.get("kvCacheStats") or {}),
            max_num_seqs=cfg.max_num_seqs,
            max_batched_tokens=cfg.max_batched_tokens,
        )


def _ended_reason(request: _Request) -> FinishReason:
    return FinishReason.CANCELLED if request.aborted else FinishReason.ERROR


def _inferred_reason(request: _Request) -> FinishReason:
    """For releases whose finished outputs carry no finish_reason."""
    if request.aborted:
        return FinishReason.CANCELLED
    if request.completion_tokens >= request.max_tokens:
        return FinishReason.LENGTH
    return FinishReason.STOP


def _latest_stats(entries: Sequence[Any]) -> Mapping[str, Any] | None:
    """The newest iteration's stats; entries are dicts or JSON strings, by version."""
    for entry in reversed(entries or ()):
        if isinstance(entry, str):
            with contextlib.suppress(ValueError):
                entry = json.loads(entry)
        if isinstance(entry, Mapping):
            return entry
    return None
