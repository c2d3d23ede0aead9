"""The sampling parameters of chat and completion bodies -> SamplingParams."""

from __future__ import annotations

from llm_router.api.openai_http.errors import invalid
from llm_router.api.openai_http.translate_format import output_format
from llm_router.api.openai_http.values import (
    INT32_MAX,
    INT64_MAX,
    Payload,
    flag,
    in_range,
    integer,
    number,
)
from llmapi.common.v1 import common_pb2

MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 300


def sampling(payload: Payload, max_tokens_names: tuple[str, ...]) -> common_pb2.SamplingParams:
    """Everything but logprobs, which chat and legacy completions spell differently."""
    params = common_pb2.SamplingParams(stop=_stop(payload), stop_token_ids=_stop_token_ids(payload))
    _basic(payload, params)
    _max_tokens(payload, params, max_tokens_names)
    _penalties(payload, params)
    _min_tokens(payload, params)
    params.logit_bias.update(_logit_bias(payload))
    params.n = integer(payload, "n", 1, MAX_N) or 0
    chosen = output_format(payload)
    if chosen is not None:
        params.format.CopyFrom(chosen)
    return params


def chat_logprobs(payload: Payload, params: common_pb2.SamplingParams) -> None:
    """`logprobs: true` and `top_logprobs: 0-20`; top_logprobs needs logprobs, as at OpenAI."""
    params.logprobs = flag(payload, "logprobs")
    top = integer(payload, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top is not None and not params.logprobs:
        raise invalid("top_logprobs requires logprobs to be true", "top_logprobs")
    params.top_logprobs = top or 0


def completion_logprobs(payload: Payload, params: common_pb2.SamplingParams) -> None:
    """Legacy `logprobs: k`: the chosen tokens' and k alternatives at each position."""
    top = integer(payload, "logprobs", 0, MAX_TOP_LOGPROBS)
    params.logprobs = top is not None
    params.top_logprobs = top or 0


def _basic(payload: Payload, params: common_pb2.SamplingParams) -> None:
    temperature = number(payload, "temperature", 0.0, 2.0)
    if temperature is not None:
        params.temperature = temperature
    top_p = number(payload, "top_p", 0.0, 1.0)
    if top_p is not None:
        params.top_p = top_p
    params.top_k = integer(payload, "top_k", 0, INT32_MAX) or 0  # vLLM's extension
    params.min_p = number(payload, "min_p", 0.0, 1.0) or 0.0  # vLLM's extension
    seed = integer(payload, "seed", -INT64_MAX - 1, INT64_MAX)
    if seed is not None:
        params.seed = seed
    params.ignore_eos = flag(payload, "ignore_eos")  # vLLM's extension
    params.disable_speculation = flag(payload, "disable_speculation")  # ours


def _max_tokens(
    payload: Payload, params: common_pb2.SamplingParams, names: tuple[str, ...]
) -> None:
    for name in names:  # the first one given wins
        max_tokens = integer(payload, name, 1, INT32_MAX)
        if max_tokens is not None:
            params.max_tokens = max_tokens
            return


def _penalties(payload: Payload, params: common_pb2.SamplingParams) -> None:
    params.presence_penalty = number(payload, "presence_penalty", -2.0, 2.0) or 0.0
    params.frequency_penalty = number(payload, "frequency_penalty", -2.0, 2.0) or 0.0
    repetition = number(payload, "repetition_penalty", 0.0, 2.0)  # vLLM's extension
    if repetition is not None:
        if repetition <= 0:
            raise invalid("repetition_penalty must be above 0 (1 = off)", "repetition_penalty")
        params.repetition_penalty = repetition


def _min_tokens(payload: Payload, params: common_pb2.SamplingParams) -> None:
    """vLLM's min_tokens: no end of sequence before this many tokens."""
    params.min_tokens = integer(payload, "min_tokens", 0, INT32_MAX) or 0
    if params.HasField("max_tokens") and params.min_tokens > params.max_tokens:
        raise invalid("min_tokens must not exceed max_tokens", "min_tokens")


def _logit_bias(payload: Payload) -> dict[int, float]:
    """{"token id": bias}: integer-string keys, biases in [-100, 100], 300 entries at most."""
    raw = payload.get("logit_bias")
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise invalid("logit_bias must map token ids to biases", "logit_bias")
    if len(raw) > MAX_LOGIT_BIAS:
        raise invalid(f"logit_bias may have at most {MAX_LOGIT_BIAS} entries", "logit_bias")
    return {_token_id(key): _bias(key, value) for key, value in raw.items()}


def _token_id(key: str) -> int:
    if not (key.isascii() and key.isdigit()) or int(key) > INT32_MAX:
        raise invalid(f"logit_bias keys must be token ids (got {key!r})", "logit_bias")
    return int(key)


def _bias(key: str, value: object) -> float:
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and in_range(value, -100, 100)
    ):
        return float(value)
    raise invalid(f"logit_bias[{key!r}] must be a number in [-100, 100]", "logit_bias")


def _stop(payload: Payload) -> list[str]:
    stop = payload.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise invalid("stop must be a string or a list of strings", "stop")


def _stop_token_ids(payload: Payload) -> list[int]:
    """vLLM's stop_token_ids."""
    ids = payload.get("stop_token_ids")
    if ids is None:
        return []
    if not isinstance(ids, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) and 0 <= i <= INT32_MAX for i in ids
    ):
        raise invalid("stop_token_ids must be a list of token ids", "stop_token_ids")
    return list(ids)
