"""Request validation and mapping: GenerateRequest -> engine SamplingOptions, Embed, WatchLoad."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llm_common.validation import Violations, check_range, check_repeated, check_text
from llm_inference.config import Limits
from llm_inference.delivery import MAX_HOLD_MS, MAX_TOKENS_PER_MESSAGE, Delivery
from llm_inference.deployment import ModelFacts
from llm_inference.engine.api import Resume, SamplingOptions
from llm_inference.engine.validation import (
    MAX_LOGIT_BIAS,
    MAX_LOGIT_BIAS_ENTRIES,
    MAX_PENALTY,
    MAX_TOP_LOGPROBS,
)
from llm_inference.output_format import check_output_format, output_format_spec
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as pb

MAX_TEMPERATURE = 2.0
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
DEFAULT_WATCH_INTERVAL_MS = 500
MIN_WATCH_INTERVAL_MS = 50
MAX_WATCH_INTERVAL_MS = 60_000


@dataclass(frozen=True, slots=True)
class GenerateInput:
    """A validated GenerateRequest, in engine terms."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingOptions
    priority: int
    detokenize: bool
    delivery: Delivery
    resume: Resume | None = None


def generate_input(request: pb.GenerateRequest, facts: ModelFacts, limits: Limits) -> GenerateInput:
    """Validate every field (all violations reported at once) and map it to engine types."""
    v = Violations()
    _check_request_id(v, "request_id", request.request_id)
    prompt = tuple(request.prompt_token_ids)
    _check_prompt(v, prompt, facts)
    sampling = request.sampling
    _check_sampling(v, sampling, facts, limits)
    max_tokens = _check_max_tokens(v, sampling, len(prompt), facts)
    _check_min_tokens(v, sampling.min_tokens, max_tokens)
    delivery = _delivery(v, request.delivery)
    resume = _resume(v, request, max_tokens, facts) if request.HasField("resume") else None
    v.raise_if_any()
    return GenerateInput(
        request_id=request.request_id,
        prompt_token_ids=prompt,
        sampling=sampling_options(sampling, max_tokens, detokenize=request.detokenize),
        priority=request.priority,
        detokenize=request.detokenize,
        delivery=delivery,
        resume=resume,
    )


def _resume(
    v: Violations, request: pb.GenerateRequest, max_tokens: int, facts: ModelFacts
) -> Resume:
    """The answer so far of a migrated request: it must leave room to generate."""
    ids = tuple(request.resume.token_ids)
    field = "resume.token_ids"
    if len(ids) >= max_tokens:
        v.add(field, f"has {len(ids)} ids; max_tokens {max_tokens} leaves none to generate")
    elif len(request.prompt_token_ids) + len(ids) > facts.max_context - 1:
        v.add(field, f"with the prompt, must have at most {facts.max_context - 1} ids")
    _check_ids(v, field, ids, facts.vocab_size)
    if request.resume.text_sent_chars < 0:
        v.add("resume.text_sent_chars", "must be >= 0")
    return Resume(ids, request.resume.text_sent_chars)


def stop_request_id(request: pb.StopRequest) -> str:
    """The request_id of a valid StopRequest, else InvalidArgument."""
    v = Violations()
    _check_request_id(v, "request_id", request.request_id)
    v.raise_if_any()
    return request.request_id


def _delivery(v: Violations, given: pb.Delivery) -> Delivery:
    check_range(
        v,
        "delivery.max_tokens_per_message",
        given.max_tokens_per_message,
        min_value=0,
        max_value=MAX_TOKENS_PER_MESSAGE,
    )
    check_range(v, "delivery.max_hold_ms", given.max_hold_ms, min_value=0, max_value=MAX_HOLD_MS)
    return Delivery(given.max_tokens_per_message, given.max_hold_ms / 1000.0)


def sampling_options(
    sampling: common_pb2.SamplingParams, max_tokens: int, *, detokenize: bool
) -> SamplingOptions:
    """The engine's options; unset optional fields take the contract's defaults."""
    return SamplingOptions(
        temperature=sampling.temperature if sampling.HasField("temperature") else 1.0,
        top_p=sampling.top_p if sampling.HasField("top_p") else 1.0,
        top_k=sampling.top_k,
        max_tokens=max_tokens,
        seed=sampling.seed if sampling.HasField("seed") else None,
        stop_token_ids=tuple(sampling.stop_token_ids),
        stop_strings=tuple(sampling.stop),
        ignore_eos=sampling.ignore_eos,
        logprobs=sampling.logprobs or sampling.top_logprobs > 0,
        detokenize=detokenize,
        top_logprobs=sampling.top_logprobs,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        repetition_penalty=(
            sampling.repetition_penalty if sampling.HasField("repetition_penalty") else 1.0
        ),
        logit_bias=tuple(sorted(sampling.logit_bias.items())),
        min_tokens=sampling.min_tokens,
        min_p=sampling.min_p,
        output_format=output_format_spec(sampling),
        speculative=not sampling.disable_speculation,
    )


def _check_request_id(v: Violations, field: str, value: str) -> None:
    v.require(
        REQUEST_ID_PATTERN.fullmatch(value) is not None,
        field,
        "must be 1-128 characters from [A-Za-z0-9._:-]",
    )


def _check_prompt(v: Violations, prompt: Sequence[int], facts: ModelFacts) -> None:
    field = "prompt_token_ids"
    if not prompt:
        v.add(field, "must not be empty")
        return
    if len(prompt) > facts.max_context - 1:
        v.add(field, f"must have at most {facts.max_context - 1} ids (context {facts.max_context})")
        return
    _check_ids(v, field, prompt, facts.vocab_size)


def _check_ids(v: Violations, field: str, ids: Sequence[int], vocab_size: int) -> None:
    # One violation for the first bad id: a long garbage prompt must not produce a huge error.
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        index = next(i for i, t in enumerate(ids) if not 0 <= t < vocab_size)
        v.add(f"{field}[{index}]", f"token id {ids[index]} is outside [0, {vocab_size})")


def _check_sampling(
    v: Violations, sampling: common_pb2.SamplingParams, facts: ModelFacts, limits: Limits
) -> None:
    if sampling.HasField("temperature"):
        check_range(
            v,
            "sampling.temperature",
            sampling.temperature,
            min_value=0.0,
            max_value=MAX_TEMPERATURE,
        )
    if sampling.HasField("top_p") and check_range(
        v, "sampling.top_p", sampling.top_p, max_value=1.0
    ):
        v.require(sampling.top_p > 0.0, "sampling.top_p", "must be in (0, 1]")
    check_range(v, "sampling.top_k", sampling.top_k, min_value=0, max_value=facts.vocab_size)
    _check_stop_strings(v, sampling.stop, limits)
    if check_repeated(
        v, "sampling.stop_token_ids", sampling.stop_token_ids, max_items=limits.max_stop_token_ids
    ):
        _check_ids(v, "sampling.stop_token_ids", sampling.stop_token_ids, facts.vocab_size)
    _check_sampling_surface(v, sampling)
    _check_logit_bias(v, sampling.logit_bias, facts.vocab_size)
    check_output_format(v, sampling)


def _check_sampling_surface(v: Violations, sampling: common_pb2.SamplingParams) -> None:
    """n, top_logprobs, the penalties and min_p."""
    v.require(
        sampling.n in (0, 1),
        "sampling.n",
        "must be 0 or 1: a replica serves one completion per Generate (the router fans out n > 1)",
    )
    check_range(
        v, "sampling.top_logprobs", sampling.top_logprobs, min_value=0, max_value=MAX_TOP_LOGPROBS
    )
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(sampling, name)
        check_range(v, f"sampling.{name}", value, min_value=-MAX_PENALTY, max_value=MAX_PENALTY)
    field = "sampling.repetition_penalty"
    if sampling.HasField("repetition_penalty") and check_range(
        v, field, sampling.repetition_penalty, max_value=MAX_PENALTY
    ):
        v.require(sampling.repetition_penalty > 0.0, field, f"must be in (0, {MAX_PENALTY:g}]")
    check_range(v, "sampling.min_p", sampling.min_p, min_value=0.0, max_value=1.0)


def _check_logit_bias(v: Violations, bias: Mapping[int, float], vocab_size: int) -> None:
    field = "sampling.logit_bias"
    if not check_repeated(v, field, bias, max_items=MAX_LOGIT_BIAS_ENTRIES):
        return
    for token_id, value in sorted(bias.items()):
        entry = f"{field}[{token_id}]"
        if v.require(0 <= token_id < vocab_size, entry, f"token id is outside [0, {vocab_size})"):
            check_range(v, entry, value, min_value=-MAX_LOGIT_BIAS, max_value=MAX_LOGIT_BIAS)


def _check_min_tokens(v: Violations, min_tokens: int, max_tokens: int) -> None:
    field = "sampling.min_tokens"
    if v.require(min_tokens >= 0, field, "must be >= 0"):
        v.require(min_tokens <= max_tokens, field, f"must be <= max_tokens ({max_tokens})")


def _check_stop_strings(v: Violations, stop: Sequence[str], limits: Limits) -> None:
    if not check_repeated(v, "sampling.stop", stop, max_items=limits.max_stop_strings):
        return
    for i, text in enumerate(stop):
        check_text(v, f"sampling.stop[{i}]", text, limits.max_stop_string_bytes)


def _check_max_tokens(
    v: Violations, sampling: common_pb2.SamplingParams, prompt_len: int, facts: ModelFacts
) -> int:
    room = max(facts.max_context - prompt_len, 1)
    if not sampling.HasField("max_tokens"):
        # The contract's default: the model's default, capped so that the request fits.
        return min(facts.default_max_tokens, room)
    field, value = "sampling.max_tokens", sampling.max_tokens
    if value < 1:
        v.add(field, "must be >= 1")
    elif 0 < prompt_len < facts.max_context and value > room:
        v.add(field, f"prompt ({prompt_len}) + max_tokens must be <= {facts.max_context}")
    return value


def embed_inputs(request: pb.EmbedRequest, limits: Limits) -> list[str]:
    """The texts of a valid EmbedRequest, else InvalidArgument with every violation."""
    v = Violations()
    if request.request_id:
        _check_request_id(v, "request_id", request.request_id)
    texts = list(request.inputs)
    if check_repeated(v, "inputs", texts, min_items=1, max_items=limits.max_embed_inputs):
        for i, text in enumerate(texts):
            check_text(v, f"inputs[{i}]", text, limits.max_embed_text_bytes)
    v.raise_if_any()
    return texts


def watch_interval_s(request: pb.WatchLoadRequest) -> float:
    """The report interval in seconds (0 means the default), else InvalidArgument."""
    interval = request.interval_ms or DEFAULT_WATCH_INTERVAL_MS
    v = Violations()
    check_range(
        v,
        "interval_ms",
        interval,
        min_value=MIN_WATCH_INTERVAL_MS,
        max_value=MAX_WATCH_INTERVAL_MS,
    )
    v.raise_if_any()
    return interval / 1000.0
