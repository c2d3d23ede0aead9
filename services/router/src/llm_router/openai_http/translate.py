"""OpenAI request bodies -> LLMService requests, rejecting what cannot be honoured with a 400."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llm_router.openai_http.errors import invalid
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
_ROLES = {
    "system": common_pb2.ROLE_SYSTEM,
    "developer": common_pb2.ROLE_SYSTEM,
    "user": common_pb2.ROLE_USER,
    "assistant": common_pb2.ROLE_ASSISTANT,
    "tool": common_pb2.ROLE_TOOL,
}
# Parameters the platform cannot honour: sending them with a non-default value is a 400
# rather than a silently different answer.
_UNSUPPORTED_IF_SET = ("tools", "functions", "tool_choice", "function_call", "logit_bias", "audio")
_PENALTIES = ("presence_penalty", "frequency_penalty")

Payload = Mapping[str, Any]


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


def _optional(payload: Payload, name: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = payload.get(name)
    if value is None:
        return None
    # bool is an int in Python but never a number in JSON Schema.
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise invalid(f"{name} must be {what}", name)
    if not isinstance(value, kind):
        raise invalid(f"{name} must be {what}", name)
    return value


def _number(payload: Payload, name: str, low: float, high: float) -> float | None:
    value = _optional(payload, name, (int, float), "a number")
    if value is None:
        return None
    if not math.isfinite(value) or not low <= value <= high:
        raise invalid(f"{name} must be between {low:g} and {high:g}", name)
    return float(value)


def _integer(payload: Payload, name: str, low: int, high: int) -> int | None:
    value = _optional(payload, name, int, "an integer")
    if value is None:
        return None
    if not low <= value <= high:
        raise invalid(f"{name} must be between {low} and {high}", name)
    return int(value)


def _flag(payload: Payload, name: str) -> bool:
    return bool(_optional(payload, name, bool, "a boolean"))


def _reject_unsupported(payload: Payload) -> None:
    for name in _UNSUPPORTED_IF_SET:
        if payload.get(name):
            raise invalid(f"{name} is not supported by this server", name, "unsupported_parameter")
    for name in _PENALTIES:
        if _number(payload, name, -2.0, 2.0):
            raise invalid(f"{name} is not supported by this server", name, "unsupported_parameter")
    n = _integer(payload, "n", 1, 128)
    if n is not None and n != 1:
        raise invalid("only n=1 is supported", "n", "unsupported_parameter")
    if _integer(payload, "top_logprobs", 0, 20):
        raise invalid("top_logprobs is not supported", "top_logprobs", "unsupported_parameter")
    response_format = payload.get("response_format")
    if response_format is not None and response_format != {"type": "text"}:
        raise invalid("only the text response_format is supported", "response_format")


def _stop(payload: Payload) -> list[str]:
    stop = payload.get("stop")
    if stop is None:
        return []
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return list(stop)
    raise invalid("stop must be a string or a list of strings", "stop")


def _sampling(payload: Payload, max_tokens_names: tuple[str, ...]) -> common_pb2.SamplingParams:
    sampling = common_pb2.SamplingParams(stop=_stop(payload))
    temperature = _number(payload, "temperature", 0.0, 2.0)
    if temperature is not None:
        sampling.temperature = temperature
    top_p = _number(payload, "top_p", 0.0, 1.0)
    if top_p is not None:
        sampling.top_p = top_p
    top_k = _integer(payload, "top_k", 0, INT32_MAX)  # vLLM's extension
    if top_k is not None:
        sampling.top_k = top_k
    for name in max_tokens_names:
        max_tokens = _integer(payload, name, 1, INT32_MAX)
        if max_tokens is not None:
            sampling.max_tokens = max_tokens
            break
    seed = _integer(payload, "seed", -INT64_MAX - 1, INT64_MAX)
    if seed is not None:
        sampling.seed = seed
    sampling.ignore_eos = _flag(payload, "ignore_eos")  # vLLM's extension
    return sampling


def _cache_policy(payload: Payload) -> pb.CachePolicy:
    """`cache` (this platform's extension, e.g. through the client's extra_body)."""
    raw = payload.get("cache")
    if raw is None:
        return pb.CachePolicy()
    if not isinstance(raw, dict):
        raise invalid("cache must be an object", "cache")
    policy = pb.CachePolicy(
        bypass=_flag(raw, "bypass"),
        semantic=_flag(raw, "semantic"),
        store_nondeterministic=_flag(raw, "store_nondeterministic"),
    )
    threshold = _number(raw, "similarity_threshold", 0.0, 1.0)
    if threshold is not None:
        policy.similarity_threshold = threshold
    return policy


def _common(payload: Payload) -> dict[str, Any]:
    user = _optional(payload, "user", str, "a string") or ""
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
    return _flag(options, "include_usage")


def _content(message: Payload, index: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise invalid("only text content parts are supported", f"messages[{index}].content")
            texts.append(part["text"])
        return "".join(texts)
    raise invalid("each message needs text content", f"messages[{index}].content")


def _messages(payload: Payload) -> list[common_pb2.ChatMessage]:
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        raise invalid("messages must be a non-empty list", "messages")
    converted = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise invalid("each message must be an object", f"messages[{i}]")
        role = _ROLES.get(message.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise invalid(f"unsupported role {message.get('role')!r}", f"messages[{i}].role")
        name = _optional(message, "name", str, "a string") or ""
        converted.append(common_pb2.ChatMessage(role=role, content=_content(message, i), name=name))
    return converted


def chat_call(payload: Payload) -> GenerationCall:
    """POST /v1/chat/completions."""
    _reject_unsupported(payload)
    stream = _flag(payload, "stream")
    sampling = _sampling(payload, ("max_completion_tokens", "max_tokens"))
    sampling.logprobs = _flag(payload, "logprobs")
    fields = _common(payload) | {"messages": _messages(payload), "sampling": sampling}
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
    _reject_unsupported(payload)
    for name in ("echo", "suffix"):
        if payload.get(name):
            raise invalid(f"{name} is not supported by this server", name, "unsupported_parameter")
    best_of = _integer(payload, "best_of", 1, 20)
    if best_of is not None and best_of != 1:
        raise invalid("only best_of=1 is supported", "best_of", "unsupported_parameter")
    stream = _flag(payload, "stream")
    sampling = _sampling(payload, ("max_tokens",))
    # Legacy `logprobs` is a count of alternatives; any value asks for the chosen tokens'.
    sampling.logprobs = _integer(payload, "logprobs", 0, 5) is not None
    fields = _common(payload) | {"prompt": _prompt(payload), "sampling": sampling}
    return GenerationCall(fields, stream, _stream_options(payload, stream))


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
    user = _optional(payload, "user", str, "a string") or ""
    request = pb.EmbedRequest(model=_model(payload), inputs=inputs, user=user)
    return EmbedCall(request, encoding == "base64")
