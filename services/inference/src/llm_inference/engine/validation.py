"""Request checks the engine applies before accepting work (InvalidRequest names the problem)."""

from __future__ import annotations

import math
from collections.abc import Sequence

from .api import InvalidRequest, SamplingOptions

MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
MAX_REQUEST_ID_CHARS = 128


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
        raise InvalidRequest(f"request_id must be 1-{MAX_REQUEST_ID_CHARS} characters")
    if not prompt_token_ids:
        raise InvalidRequest("prompt_token_ids must not be empty")
    if len(prompt_token_ids) >= max_context:
        raise InvalidRequest(
            f"prompt has {len(prompt_token_ids)} tokens; the context holds {max_context} "
            "including at least one generated token"
        )
    if any(not 0 <= t < vocab_size for t in prompt_token_ids):
        raise InvalidRequest(f"prompt_token_ids must be in [0, {vocab_size})")
    _validate_sampling(sampling, vocab_size, has_tokenizer)


def _validate_sampling(sampling: SamplingOptions, vocab_size: int, has_tokenizer: bool) -> None:
    if not math.isfinite(sampling.temperature) or sampling.temperature < 0:
        raise InvalidRequest("temperature must be a finite number >= 0")
    if not 0 < sampling.top_p <= 1:
        raise InvalidRequest("top_p must be in (0, 1]")
    if sampling.top_k < 0:
        raise InvalidRequest("top_k must be >= 0")
    if sampling.max_tokens < 1:
        raise InvalidRequest("max_tokens must be >= 1")
    if sampling.seed is not None and not -(2**63) <= sampling.seed < 2**64:
        raise InvalidRequest("seed must fit in 64 bits")
    if len(sampling.stop_token_ids) > MAX_STOP_TOKEN_IDS:
        raise InvalidRequest(f"at most {MAX_STOP_TOKEN_IDS} stop_token_ids")
    if any(not 0 <= t < vocab_size for t in sampling.stop_token_ids):
        raise InvalidRequest(f"stop_token_ids must be in [0, {vocab_size})")
    if len(sampling.stop_strings) > MAX_STOP_STRINGS:
        raise InvalidRequest(f"at most {MAX_STOP_STRINGS} stop_strings")
    if any(not s or len(s) > MAX_STOP_STRING_CHARS for s in sampling.stop_strings):
        raise InvalidRequest(f"stop_strings must be 1-{MAX_STOP_STRING_CHARS} characters")
    if sampling.stop_strings and not has_tokenizer:
        raise InvalidRequest("stop_strings need a tokenizer; this checkpoint has none")
