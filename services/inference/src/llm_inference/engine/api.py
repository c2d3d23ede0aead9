"""Types shared by every generation backend and the gRPC service that drives them."""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class SamplingOptions:
    """Per-request sampling and stopping settings."""

    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = disabled
    max_tokens: int = 256
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False
    detokenize: bool = True  # stream text_delta (when the engine has a tokenizer)


class FinishReason(enum.Enum):
    """Why a request stopped producing tokens."""

    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class RequestTimings:
    """Milliseconds spent in each phase of one request."""

    queue_ms: float
    prefill_ms: float
    ttft_ms: float
    decode_ms: float


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """One streamed step of one request."""

    token_ids: tuple[int, ...]
    text_delta: (
        str  # "" unless the engine has a tokenizer; never splits UTF-8; stop strings removed
    )
    logprobs: tuple[float, ...] | None
    finish_reason: FinishReason | None  # set on the last event only
    prompt_tokens: int
    completion_tokens: int  # so far
    cached_tokens: int  # prompt tokens served from the prefix cache
    timings: RequestTimings | None  # set on the last event only

    def then(self, later: TokenEvent) -> TokenEvent:
        """This event and the one after it as one (its counts and finish are the later's)."""
        logprobs = (
            (self.logprobs or ()) + (later.logprobs or ())
            if self.logprobs is not None or later.logprobs is not None
            else None
        )
        return TokenEvent(
            token_ids=self.token_ids + later.token_ids,
            text_delta=self.text_delta + later.text_delta,
            logprobs=logprobs,
            finish_reason=later.finish_reason,
            prompt_tokens=later.prompt_tokens,
            completion_tokens=later.completion_tokens,
            cached_tokens=later.cached_tokens,
            timings=later.timings,
        )


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """Instantaneous load of one engine, for routers and metrics."""

    num_waiting: int
    num_running: int
    kv_blocks_total: int
    kv_blocks_free: int
    kv_cache_usage: float
    waiting_prompt_tokens: int
    running_remaining_tokens: int
    tokens_per_second: float
    prefix_cache_hit_rate: float
    max_num_seqs: int


@dataclass(frozen=True, slots=True)
class EngineInfo:
    """Static description of a loaded engine."""

    model: str
    backend: str
    dtype: str
    device: str
    max_context: int
    kv_block_size: int
    kv_blocks_total: int
    max_num_seqs: int
    max_batched_tokens: int


class GenerationBackend(Protocol):
    """What the gRPC service calls; the torch engine and the TensorRT-LLM adapter implement it."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        sampling: SamplingOptions,
        priority: int = 0,
    ) -> AsyncIterator[TokenEvent]:
        """Stream one request's events; closing the iterator (aclose, cancellation) aborts it."""
        ...

    def abort(self, request_id: str) -> None:
        """Idempotent; frees KV blocks at once; the request's stream ends CANCELLED."""
        ...

    def load(self) -> LoadSnapshot: ...

    def info(self) -> EngineInfo: ...


class EngineError(Exception):
    """Base of every error the engine raises to its callers."""


class InvalidRequest(EngineError):  # noqa: N818 - name fixed by the interface
    """The request cannot be served as given (prompt too long, bad sampling values...)."""
