"""OpenAI request bodies -> LLMService requests, rejecting what cannot be honoured with a 400."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from llm_router.api.openai_http.errors import invalid
from llm_router.api.openai_http.translate_sampling import (
    MAX_N,
    chat_logprobs,
    completion_logprobs,
    sampling,
)
from llm_router.api.openai_http.translate_tools import messages, tool_fields
from llm_router.api.openai_http.values import Payload, flag, integer, number, text
from llmapi.llm.v1 import llm_service_pb2 as pb

# Parameters the platform cannot honour: sending them with a non-default value is a 400
# rather than a silently different answer.
_UNSUPPORTED_IF_SET = ("audio",)
# Chat-only features sent to /v1/completions.
_UNSUPPORTED_IN_COMPLETIONS = (
    "echo",
    "suffix",
    "tools",
    "tool_choice",
    "functions",
    "function_call",
)


@dataclass(frozen=True, slots=True)
class GenerationCall:
    """A chat or completion call: the request fields and how to answer."""

    fields: dict[str, Any]  # keyword arguments of the LLMService request message
    stream: bool
    include_usage: bool  # stream_options.include_usage: a final chunk with usage


@dataclass(frozen=True, slots=True)
class EmbedCall:
    request: pb.EmbedRequest
    base64: bool  # encoding_format "base64": little-endian float32, base64-encoded


def parse_body(body: bytes) -> Payload:
    """The JSON object of a request body."""
    if not body:
        raise invalid("the request body must be a JSON object")
    try:
        # Strict UTF-8: json.loads(bytes) would let surrogates through ("surrogatepass").
        payload = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise invalid("the request body is not valid JSON") from None
    except RecursionError:
        raise invalid("the request body is nested too deeply") from None
    if not isinstance(payload, dict):
        raise invalid("the request body must be a JSON object")
    _check_encodable(payload)
    return payload


def _check_encodable(payload: Payload) -> None:
    # A lone surrogate escape ("\ud800") decodes to a str no protobuf string can carry.
    try:
        json.dumps(payload, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise invalid("the request body has an unpaired \\u surrogate escape") from None
    except RecursionError:
        raise invalid("the request body is nested too deeply") from None


def _model(payload: Payload) -> str:
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("you must provide a model parameter", "model")
    return model


def _reject_unsupported(payload: Payload, names: tuple[str, ...]) -> None:
    for name in names:
        if payload.get(name):
            raise invalid(f"{name} is not supported by this server", name, "unsupported_parameter")


def _cache_policy(payload: Payload) -> pb.CachePolicy:
    """`cache` (this platform's extension, e.g. through the client's extra_body)."""
    raw = payload.get("cache")
    if raw is None:
        return pb.CachePolicy()
    if not isinstance(raw, dict):
        raise invalid("cache must be an object", "cache")
    policy = pb.CachePolicy(
        bypass=flag(raw, "bypass"),
        semantic=flag(raw, "semantic"),
        store_nondeterministic=flag(raw, "store_nondeterministic"),
    )
    threshold = number(raw, "similarity_threshold", 0.0, 1.0)
    if threshold is not None:
        policy.similarity_threshold = threshold
    return policy


def _common(payload: Payload) -> dict[str, Any]:
    user = text(payload, "user")
    metadata = payload.get("metadata") or {}
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise invalid("metadata must map strings to strings", "metadata")
    return {
        "model": _model(payload),
        "user": user,
        "metadata": metadata,
        "cache": _cache_policy(payload),
    }


def _stream_options(payload: Payload, stream: bool) -> bool:
    options = payload.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise invalid("stream_options requires stream: true", "stream_options")
    if not isinstance(options, dict):
        raise invalid("stream_options must be an object", "stream_options")
    return flag(options, "include_usage")


def chat_call(payload: Payload) -> GenerationCall:
    """POST /v1/chat/completions."""
    _reject_unsupported(payload, _UNSUPPORTED_IF_SET)
    stream = flag(payload, "stream")
    params = sampling(payload, ("max_completion_tokens", "max_tokens"))
    chat_logprobs(payload, params)
    fields = (
        _common(payload)
        | {"messages": messages(payload), "sampling": params}
        | tool_fields(payload)
    )
    return GenerationCall(fields, stream, _stream_options(payload, stream))


def _prompt(payload: Payload) -> str:
    prompt = payload.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0]
    if isinstance(prompt, str) and prompt:
        return prompt
    if _token_id_prompt(prompt):
        raise invalid(
            "prompts given as token ids are not supported; send the prompt as text",
            "prompt",
            "unsupported_parameter",
        )
    if isinstance(prompt, list) and len(prompt) > 1:
        raise invalid("only one prompt per request is supported", "prompt", "unsupported_parameter")
    raise invalid("prompt must be a non-empty string", "prompt")


def _token_id_prompt(prompt: object) -> bool:
    """OpenAI's token-id prompt forms, [1, 2, 3] and [[1, 2], [3]] (not several texts)."""
    if not isinstance(prompt, list) or not prompt:
        return False
    if all(_is_token_id(t) for t in prompt):
        return True
    return all(isinstance(p, list) and p and all(_is_token_id(t) for t in p) for p in prompt)


def _is_token_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def completion_call(payload: Payload) -> GenerationCall:
    """POST /v1/completions (legacy text completion)."""
    _reject_unsupported(payload, (*_UNSUPPORTED_IF_SET, *_UNSUPPORTED_IN_COMPLETIONS))
    stream = flag(payload, "stream")
    params = sampling(payload, ("max_tokens",))
    _check_best_of(payload, params.n or 1)
    completion_logprobs(payload, params)
    fields = _common(payload) | {"prompt": _prompt(payload), "sampling": params}
    return GenerationCall(fields, stream, _stream_options(payload, stream))


def _check_best_of(payload: Payload, n: int) -> None:
    """best_of > n would rank candidates the platform does not score: only best_of == n."""
    best_of = integer(payload, "best_of", 1, MAX_N)
    if best_of is not None and best_of != n:
        raise invalid(
            "best_of must equal n (ranking extra candidates is not supported)",
            "best_of",
            "unsupported_parameter",
        )


def embed_call(payload: Payload) -> EmbedCall:
    """POST /v1/embeddings."""
    raw = payload.get("input")
    inputs = [raw] if isinstance(raw, str) else raw
    if not isinstance(inputs, list) or not inputs:
        raise invalid("input must be a string or a non-empty list of strings", "input")
    if not all(isinstance(text, str) for text in inputs):
        raise invalid(
            "token-id input is not supported; send text", "input", "unsupported_parameter"
        )
    encoding = payload.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise invalid("encoding_format must be float or base64", "encoding_format")
    if payload.get("dimensions") is not None:
        raise invalid("dimensions is not supported", "dimensions", "unsupported_parameter")
    user = text(payload, "user")
    request = pb.EmbedRequest(model=_model(payload), inputs=inputs, user=user)
    return EmbedCall(request, encoding == "base64")
