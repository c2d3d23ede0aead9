"""Types shared by every generation backend and the gRPC service that drives them."""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Protocol


class FormatKind(enum.Enum):
    """Kinds of output constraint (common.v1.OutputFormat's oneof)."""

    JSON_OBJECT = "json_object"
    JSON_SCHEMA = "json_schema"
    REGEX = "regex"
    GRAMMAR = "grammar"  # EBNF, start rule `root`
    CHOICE = "choice"
    TAGGED_JSON = "tagged_json"  # begin + JSON(schema) + end, 1..max_items times


@dataclass(frozen=True, slots=True)
class OutputFormatSpec:
    """A constraint on the output, as the caller gave it (compiled by the backend).

    `spec` is the JSON schema, regex or EBNF text ("" for JSON_OBJECT); CHOICE uses `choices`;
    TAGGED_JSON uses `spec` (the schema) with `begin`, `end`, `separator` and `max_items`.
    """

    kind: FormatKind
    spec: str = ""
    choices: tuple[str, ...] = ()
    begin: str = ""
    end: str = ""
    separator: str = ""
    max_items: int = 1


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
    top_logprobs: int = 0  # alternatives per token (0-20); > 0 implies logprobs
    presence_penalty: float = 0.0  # [-2, 2], once per token seen in the output
    frequency_penalty: float = 0.0  # [-2, 2], per occurrence in the output
    repetition_penalty: float = 1.0  # (0, 2], prompt and output tokens; 1 = off
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias in [-100, 100])
    min_tokens: int = 0  # EOS and stop tokens masked until this many were generated
    min_p: float = 0.0  # [0, 1]; 0 = off
    output_format: OutputFormatSpec | None = None  # constrained decoding
    # False opts out of speculative decoding (greedy output is the same either way; this
    # only trades the speedup for a steadier per-token latency).
    speculative: bool = True


@dataclass(frozen=True, slots=True)
class Resume:
    """The answer so far of a request another replica started (mid-stream migration).

    The engine continues as if it had generated `token_ids` itself (max_tokens, min_tokens,
    penalties, output format and seeded draws all pick up where they were) and streams only
    what follows; `text_sent_chars` of their decoded text were already delivered, the rest
    (held back as a possible stop string) goes out with the next tokens.
    """

    token_ids: tuple[int, ...]
    text_sent_chars: int = 0


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
class TopToken:
    """One alternative at a position: a token id and its log-probability."""

    token_id: int
    logprob: float


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
    # Per token, the top_logprobs alternatives (most likely first); None unless asked for.
    top_logprobs: tuple[tuple[TopToken, ...], ...] | None = None

    def then(self, later: TokenEvent) -> TokenEvent:
        """This event and the one after it as one (its counts and finish are the later's)."""
        logprobs = (
            (self.logprobs or ()) + (later.logprobs or ())
            if self.logprobs is not None or later.logprobs is not None
            else None
        )
        top = (
            (self.top_logprobs or ()) + (later.top_logprobs or ())
            if self.top_logprobs is not None or later.top_logprobs is not None
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
            top_logprobs=top,
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
        resume: Resume | None = None,
    ) -> AsyncIterator[TokenEvent]:
        """Stream one request's events; closing the iterator (aclose, cancellation) aborts it.
        `resume`: continue another replica's answer (backends that cannot raise
        InvalidRequest)."""
        ...

    def abort(self, request_id: str) -> None:
        """Idempotent; frees KV blocks at once; the request's stream ends CANCELLED."""
        ...

    def load(self) -> LoadSnapshot: ...

    def info(self) -> EngineInfo: ...


class EngineError(Exception):
    """Base of every error the engine raises to its callers."""


class InvalidRequest(EngineError):  # noqa: N818 - name fixed by the interface
    """The request cannot be served as given (prompt too long, bad sampling values...).

    `field` names the request field at fault (e.g. "sampling.format.json_schema"), when known.
    """

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field
