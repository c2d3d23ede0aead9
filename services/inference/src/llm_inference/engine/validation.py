"""Request checks the engine applies before accepting work (InvalidRequest names the problem)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .api import InvalidRequest, Resume, SamplingOptions

MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
MAX_REQUEST_ID_CHARS = 128
MAX_TOP_LOGPROBS = 20
MAX_PENALTY = 2.0  # presence and frequency in [-2, 2]; repetition in (0, 2]
MAX_LOGIT_BIAS = 100.0
MAX_LOGIT_BIAS_ENTRIES = 300


def validate_request(
    request_id: str,
    prompt_token_ids: Sequence[int],
    sampling: SamplingOptions,
    *,
    vocab_size: int,
    max_context: int,
    has_tokenizer: bool,
) -> None:
    """Raise InvalidRequest when the request cannot be served as given."""
    if not request_id or len(request_id) > MAX_REQUEST_ID_CHARS:
        raise InvalidRequest(
            f"request_id must be 1-{MAX_REQUEST_ID_CHARS} characters", "request_id"
        )
    if not prompt_token_ids:
        raise InvalidRequest("prompt_token_ids must not be empty", "prompt_token_ids")
    if len(prompt_token_ids) >= max_context:
        raise InvalidRequest(
            f"prompt has {len(prompt_token_ids)} tokens; the context holds {max_context} "
            "including at least one generated token"
        )
    if any(not 0 <= t < vocab_size for t in prompt_token_ids):
        raise InvalidRequest(f"prompt_token_ids must be in [0, {vocab_size})")
    _validate_sampling(sampling, vocab_size, has_tokenizer)


def validate_resume(
    prompt_len: int, resume: Resume, sampling: SamplingOptions, *, vocab_size: int, max_context: int
) -> None:
    """Raise InvalidRequest when `resume` cannot continue this prompt under these options."""
    ids = resume.token_ids
    if len(ids) >= sampling.max_tokens:
        raise InvalidRequest(
            f"resume has {len(ids)} tokens; max_tokens {sampling.max_tokens} leaves none to "
            "generate",
            "resume.token_ids",
        )
    if prompt_len + len(ids) >= max_context:
        raise InvalidRequest(
            f"prompt and resume have {prompt_len + len(ids)} tokens; the context holds "
            f"{max_context} including at least one generated token",
            "resume.token_ids",
        )
    if any(not 0 <= t < vocab_size for t in ids):
        raise InvalidRequest(f"resume.token_ids must be in [0, {vocab_size})", "resume.token_ids")
    if resume.text_sent_chars < 0:
        raise InvalidRequest("resume.text_sent_chars must not be negative", "resume")


def _validate_sampling(sampling: SamplingOptions, vocab_size: int, has_tokenizer: bool) -> None:
    _validate_basics(sampling)
    _validate_stops(sampling, vocab_size, has_tokenizer)
    _validate_penalties(sampling)
    _validate_logit_bias(sampling.logit_bias, vocab_size)
    if not 0 <= sampling.top_logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(
            f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]", "sampling.top_logprobs"
        )
    if not 0 <= sampling.min_tokens <= sampling.max_tokens:
        raise InvalidRequest("min_tokens must be in [0, max_tokens]", "sampling.min_tokens")
    if not _within(sampling.min_p, 0.0, 1.0):
        raise InvalidRequest("min_p must be in [0, 1]", "sampling.min_p")


def _within(value: float, low: float, high: float) -> bool:
    """low <= value <= high (NaN is never within)."""
    return low <= value <= high


def _validate_basics(sampling: SamplingOptions) -> None:
    if not math.isfinite(sampling.temperature) or sampling.temperature < 0:
        raise InvalidRequest("temperature must be a finite number >= 0", "sampling.temperature")
    if not 0 < sampling.top_p <= 1:
        raise InvalidRequest("top_p must be in (0, 1]", "sampling.top_p")
    if sampling.top_k < 0:
        raise InvalidRequest("top_k must be >= 0", "sampling.top_k")
    if sampling.max_tokens < 1:
        raise InvalidRequest("max_tokens must be >= 1", "sampling.max_tokens")
    if sampling.seed is not None and not -(2**63) <= sampling.seed < 2**64:
        raise InvalidRequest("seed must fit in 64 bits", "sampling.seed")


def _validate_stops(sampling: SamplingOptions, vocab_size: int, has_tokenizer: bool) -> None:
    if len(sampling.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidRequest(
            f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids", "sampling.stop_token_ids"
        )
    if any(not 0 <= t < vocab_size for t in sampling.stop_token_ids):
        raise InvalidRequest(
            f"stop_token_ids must be in [0, {vocab_size})", "sampling.stop_token_ids"
        )
    if len(sampling.stop_strings) > MAX_STOP_STRINGS:
        raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop_strings", "sampling.stop")
    if any(not s or len(s) > MAX_STOP_STRING_CHARS for s in sampling.stop_strings):
        raise InvalidRequest(
            f"stop_strings must be 1-{MAX_STOP_STRING_CHARS} characters", "sampling.stop"
        )
    if sampling.stop_strings and not has_tokenizer:
        raise InvalidRequest(
            "stop_strings need a tokenizer; this checkpoint has none", "sampling.stop"
        )


def _validate_penalties(sampling: SamplingOptions) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        if not _within(getattr(sampling, name), -MAX_PENALTY, MAX_PENALTY):
            raise InvalidRequest(
                f"{name} must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}]", f"sampling.{name}"
            )
    if not 0 < sampling.repetition_penalty <= MAX_PENALTY:
        raise InvalidRequest(
            f"repetition_penalty must be in (0, {MAX_PENALTY:g}]", "sampling.repetition_penalty"
        )


def _validate_logit_bias(bias: tuple[tuple[int, float], ...], vocab_size: int) -> None:
    field = "sampling.logit_bias"
    if len(bias) > MAX_LOGIT_BIAS_ENTRIES:
        raise InvalidRequest(f"logit_bias has at most {MAX_LOGIT_BIAS_ENTRIES} entries", field)
    for token_id, value in bias:
        if not 0 <= token_id < vocab_size:
            raise InvalidRequest(
                f"logit_bias token id {token_id} is outside [0, {vocab_size})", field
            )
        if not _within(value, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS):
            raise InvalidRequest(
                f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}]", field
            )
