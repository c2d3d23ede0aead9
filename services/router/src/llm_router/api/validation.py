"""Request validation: every field of every RPC, all violations reported at once."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from google.rpc import error_details_pb2

from llm_common.errors import DEFAULT_DOMAIN, FieldViolation, InvalidArgument
from llm_common.validation import Violations, check_range, check_repeated, check_text, utf8_length
from llm_router.api.sampling_checks import check_generation_options
from llm_router.api.tool_checks import check_tool_messages, check_tools
from llm_router.config import Limits
from llm_router.requests import CacheOptions, EmbedRequest, GenerationRequest, Kind
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

ChatLike = pb.ChatRequest | pb.ChatStreamRequest
CompleteLike = pb.CompleteRequest | pb.CompleteStreamRequest

MAX_MODEL_NAME_BYTES = 128
_REQUEST_ID = re.compile(r"[A-Za-z0-9._-]{1,128}")
_ROLES = frozenset(common_pb2.Role.values()) - {common_pb2.ROLE_UNSPECIFIED}


def validate_chat(request: ChatLike, limits: Limits) -> GenerationRequest:
    """A GenerationRequest from a Chat/ChatStream request; INVALID_ARGUMENT listing every
    violation otherwise."""
    v = Violations()
    _check_size(v, request.ByteSize(), limits)
    _check_model(v, request.model)
    check_messages(v, request.messages, limits)
    check_tool_messages(v, request.messages)
    check_tools(v, request.tools, request.tool_choice, limits)
    _check_common(v, request, limits)
    if request.sampling.HasField("format") and _forces_call(request):
        v.add("sampling.format", "cannot be combined with a forced tool call (tool_choice)")
    v.raise_if_any()
    return GenerationRequest(
        kind=Kind.CHAT,
        model=request.model,
        messages=tuple(request.messages),
        sampling=_copy_sampling(request.sampling),
        cache=_cache_options(request.cache),
        user=request.user,
        metadata=dict(request.metadata),
        request_id=request.request_id,
        fingerprint=request.SerializeToString(deterministic=True),
        tools=tuple(request.tools),
        tool_choice=_copy_choice(request.tool_choice),
        parallel_tool_calls=(
            request.parallel_tool_calls if request.HasField("parallel_tool_calls") else True
        ),
    )


def _forces_call(request: ChatLike) -> bool:
    choice = request.tool_choice
    return bool(choice.function_name) or (
        bool(request.tools) and choice.mode == common_pb2.TOOL_CHOICE_MODE_REQUIRED
    )


def _copy_choice(choice: common_pb2.ToolChoice) -> common_pb2.ToolChoice:
    copy = common_pb2.ToolChoice()
    copy.CopyFrom(choice)
    return copy


def validate_complete(request: CompleteLike, limits: Limits) -> GenerationRequest:
    """A GenerationRequest from a Complete/CompleteStream request."""
    v = Violations()
    _check_size(v, request.ByteSize(), limits)
    _check_model(v, request.model)
    check_text(v, "prompt", request.prompt, limits.max_prompt_bytes)
    _check_common(v, request, limits)
    v.raise_if_any()
    return GenerationRequest(
        kind=Kind.COMPLETION,
        model=request.model,
        prompt=request.prompt,
        sampling=_copy_sampling(request.sampling),
        cache=_cache_options(request.cache),
        user=request.user,
        metadata=dict(request.metadata),
        request_id=request.request_id,
        fingerprint=request.SerializeToString(deterministic=True),
    )


def validate_embed(request: pb.EmbedRequest, limits: Limits) -> EmbedRequest:
    """An EmbedRequest; 1..max_embed_inputs non-empty texts within the size limit."""
    v = Violations()
    _check_size(v, request.ByteSize(), limits)
    _check_model(v, request.model)
    if check_repeated(v, "inputs", request.inputs, min_items=1, max_items=limits.max_embed_inputs):
        for i, text in enumerate(request.inputs):
            check_text(v, f"inputs[{i}]", text, limits.max_embed_input_bytes)
    _check_user(v, request.user, limits)
    _check_request_id(v, request.request_id)
    v.raise_if_any()
    return EmbedRequest(
        model=request.model,
        inputs=tuple(request.inputs),
        normalize=request.normalize if request.HasField("normalize") else True,
        user=request.user,
        request_id=request.request_id,
        fingerprint=request.SerializeToString(deterministic=True),
    )


def validate_count(request: pb.CountTokensRequest, limits: Limits) -> None:
    """Exactly one of prompt or messages, each within its limits."""
    v = Violations()
    _check_size(v, request.ByteSize(), limits)
    _check_model(v, request.model)
    if bool(request.prompt) == bool(request.messages):
        v.add("prompt", "set exactly one of prompt or messages")
    elif request.messages:
        check_messages(v, request.messages, limits)
        check_tool_messages(v, request.messages)
    else:
        check_text(v, "prompt", request.prompt, limits.max_prompt_bytes)
    if request.tools:
        v.require(bool(request.messages), "tools", "tools are rendered with messages only")
        check_tools(v, request.tools, common_pb2.ToolChoice(), limits)
    v.raise_if_any()


def check_messages(
    v: Violations, messages: Sequence[common_pb2.ChatMessage], limits: Limits
) -> None:
    """1..max_messages messages with a known role and bounded content."""
    if not check_repeated(v, "messages", messages, min_items=1, max_items=limits.max_messages):
        return
    total = 0
    for i, message in enumerate(messages):
        field = f"messages[{i}]"
        v.require(
            message.role in _ROLES, f"{field}.role", "must be system, user, assistant or tool"
        )
        size = utf8_length(message.content)
        if size is None:
            v.add(f"{field}.content", "must be valid UTF-8")
        else:
            total += size
        if message.name:
            check_text(v, f"{field}.name", message.name, limits.max_name_bytes)
    if total > limits.max_content_bytes:
        v.add("messages", f"contents must total at most {limits.max_content_bytes} bytes (UTF-8)")
    if not any(message.content or message.tool_calls for message in messages):
        v.add("messages", "at least one message must have content")


CONTEXT_LENGTH_EXCEEDED = "CONTEXT_LENGTH_EXCEEDED"


class ContextLengthExceeded(InvalidArgument):
    """INVALID_ARGUMENT + BadRequest + ErrorInfo CONTEXT_LENGTH_EXCEEDED: the OpenAI front end
    answers it as OpenAI does (400, code `context_length_exceeded`, "maximum context length"
    in the message), which OpenAI-compatible clients such as litellm recognise."""

    def __init__(self, violation: FieldViolation, context_length: int) -> None:
        message = f"This model's maximum context length is {context_length} tokens"
        super().__init__([violation], message)
        info = error_details_pb2.ErrorInfo(reason=CONTEXT_LENGTH_EXCEEDED, domain=DEFAULT_DOMAIN)
        self.details = (*self.details, info)


def check_max_tokens(
    sampling: common_pb2.SamplingParams,
    prompt_tokens: int,
    context_length: int,
    default_max_tokens: int,
    *,
    prompt_field: str,
) -> int:
    """The max_tokens to generate: the request's, or the model's default capped so prompt +
    completion fit the context. INVALID_ARGUMENT when the prompt or max_tokens do not fit."""
    room = context_length - prompt_tokens
    if room < 1:
        raise ContextLengthExceeded(
            FieldViolation(
                prompt_field,
                f"the prompt has {prompt_tokens} tokens; the model's context is "
                f"{context_length} tokens including at least one generated token",
            ),
            context_length,
        )
    if not sampling.HasField("max_tokens"):
        return min(default_max_tokens, room)
    if sampling.max_tokens > room:
        raise ContextLengthExceeded(
            FieldViolation(
                "sampling.max_tokens",
                f"prompt ({prompt_tokens} tokens) + max_tokens ({sampling.max_tokens}) "
                f"exceeds the model's context length ({context_length})",
            ),
            context_length,
        )
    return sampling.max_tokens


def fits_context(
    sampling: common_pb2.SamplingParams,
    prompt_tokens: int,
    context_length: int,
    default_max_tokens: int,
) -> bool:
    """Whether prompt + max_tokens (the model's default when unset) fit the context."""
    wanted = sampling.max_tokens if sampling.HasField("max_tokens") else default_max_tokens
    return prompt_tokens + wanted <= context_length


def _check_size(v: Violations, size: int, limits: Limits) -> None:
    v.require(
        size <= limits.max_request_bytes,
        "request",
        f"must be at most {limits.max_request_bytes} bytes serialized, got {size}",
    )


def _check_model(v: Violations, model: str) -> None:
    check_text(v, "model", model, MAX_MODEL_NAME_BYTES)


def _check_common(v: Violations, request: ChatLike | CompleteLike, limits: Limits) -> None:
    check_sampling(v, request.sampling, limits)
    _check_cache(v, request.cache)
    _check_user(v, request.user, limits)
    _check_metadata(v, request.metadata, limits)
    _check_request_id(v, request.request_id)


def check_sampling(v: Violations, s: common_pb2.SamplingParams, limits: Limits) -> None:
    """Ranges of the sampling parameters and sizes of the stop lists."""
    if s.HasField("temperature"):
        check_range(v, "sampling.temperature", s.temperature, min_value=0.0, max_value=2.0)
    if s.HasField("top_p") and check_range(v, "sampling.top_p", s.top_p, max_value=1.0):
        v.require(s.top_p > 0.0, "sampling.top_p", "must be > 0")
    v.require(
        0 <= s.top_k <= limits.max_top_k,
        "sampling.top_k",
        f"must be in 0..{limits.max_top_k} (0 disables it)",
    )
    if s.HasField("max_tokens"):
        v.require(s.max_tokens >= 1, "sampling.max_tokens", "must be >= 1")
    if check_repeated(v, "sampling.stop", s.stop, max_items=limits.max_stop_strings):
        for i, stop in enumerate(s.stop):
            check_text(v, f"sampling.stop[{i}]", stop, limits.max_stop_bytes)
    if check_repeated(
        v, "sampling.stop_token_ids", s.stop_token_ids, max_items=limits.max_stop_token_ids
    ):
        for i, token in enumerate(s.stop_token_ids):
            v.require(token >= 0, f"sampling.stop_token_ids[{i}]", "must be >= 0")
    check_generation_options(v, s, limits)


def _check_cache(v: Violations, cache: pb.CachePolicy) -> None:
    if cache.HasField("similarity_threshold"):
        threshold = cache.similarity_threshold
        if check_range(v, "cache.similarity_threshold", threshold, max_value=1.0):
            v.require(threshold > 0.0, "cache.similarity_threshold", "must be in (0, 1]")


def _check_user(v: Violations, user: str, limits: Limits) -> None:
    if user:
        check_text(v, "user", user, limits.max_user_bytes)


def _check_metadata(v: Violations, metadata: Mapping[str, str], limits: Limits) -> None:
    if not check_repeated(v, "metadata", metadata, max_items=limits.max_metadata_pairs):
        return
    for key, value in metadata.items():
        if check_text(v, "metadata", key, limits.max_metadata_key_bytes):
            check_text(
                v, f"metadata[{key}]", value, limits.max_metadata_value_bytes, allow_empty=True
            )


def _check_request_id(v: Violations, request_id: str) -> None:
    if request_id:
        v.require(
            _REQUEST_ID.fullmatch(request_id) is not None,
            "request_id",
            "must be 1-128 characters of [A-Za-z0-9._-]",
        )


def _copy_sampling(sampling: common_pb2.SamplingParams) -> common_pb2.SamplingParams:
    copy = common_pb2.SamplingParams()
    copy.CopyFrom(sampling)
    if copy.top_logprobs:
        copy.logprobs = True  # alternatives come with the chosen token's logprob
    return copy


def _cache_options(cache: pb.CachePolicy) -> CacheOptions:
    return CacheOptions(
        bypass=cache.bypass,
        semantic=cache.semantic,
        similarity_threshold=(
            cache.similarity_threshold if cache.HasField("similarity_threshold") else None
        ),
        store_nondeterministic=cache.store_nondeterministic,
    )
