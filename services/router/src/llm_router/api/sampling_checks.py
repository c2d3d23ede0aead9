"""Validation of the sampling surface beyond temperature/top-p/top-k: n, logprobs, penalties,
logit bias, min_tokens, min_p and the output format (sizes and shape; the replica compiles
the grammar and names what its grammar library cannot enforce)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from llm_common.validation import Violations, check_range, check_repeated, check_text
from llm_router.config import Limits
from llmapi.common.v1 import common_pb2

MAX_N = 16
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 300
MAX_BIAS = 100.0
MAX_PENALTY = 2.0
MAX_CHOICES = 256
MAX_CHOICE_BYTES = 1024
MAX_TAGGED_ITEMS = 64


def check_generation_options(v: Violations, s: common_pb2.SamplingParams, limits: Limits) -> None:
    """Ranges of the options named in the module docstring (all violations at once)."""
    check_range(v, "sampling.n", s.n, min_value=0, max_value=MAX_N)
    check_range(v, "sampling.top_logprobs", s.top_logprobs, min_value=0, max_value=MAX_TOP_LOGPROBS)
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(s, name)
        check_range(v, f"sampling.{name}", value, min_value=-MAX_PENALTY, max_value=MAX_PENALTY)
    if s.HasField("repetition_penalty") and check_range(
        v, "sampling.repetition_penalty", s.repetition_penalty, max_value=MAX_PENALTY
    ):
        v.require(s.repetition_penalty > 0.0, "sampling.repetition_penalty", "must be in (0, 2]")
    _check_logit_bias(v, s.logit_bias)
    if check_range(v, "sampling.min_tokens", s.min_tokens, min_value=0) and s.HasField(
        "max_tokens"
    ):
        v.require(
            s.min_tokens <= s.max_tokens, "sampling.min_tokens", "must be <= sampling.max_tokens"
        )
    check_range(v, "sampling.min_p", s.min_p, min_value=0.0, max_value=1.0)
    if s.HasField("format"):
        check_format(v, "sampling.format", s.format, limits)


def _check_logit_bias(v: Violations, bias: Mapping[int, float]) -> None:
    if not check_repeated(v, "sampling.logit_bias", bias, max_items=MAX_LOGIT_BIAS):
        return
    for token, value in sorted(bias.items()):
        field = f"sampling.logit_bias[{token}]"
        v.require(token >= 0, field, "token ids must be >= 0")
        check_range(v, field, value, min_value=-MAX_BIAS, max_value=MAX_BIAS)


def check_format(v: Violations, field: str, f: common_pb2.OutputFormat, limits: Limits) -> None:
    """One kind set, within the size limits; JSON texts parse as JSON objects."""
    kind = f.WhichOneof("format")
    if kind is None:
        v.add(field, "set one of json_object, json_schema, regex, grammar, choice, tagged_json")
    elif kind == "json_object":
        v.require(f.json_object, f"{field}.json_object", "must be true when set")
    elif kind == "json_schema":
        _check_json_schema(v, f"{field}.json_schema", f.json_schema, limits)
    elif kind in ("regex", "grammar"):
        check_text(v, f"{field}.{kind}", getattr(f, kind), limits.max_schema_bytes)
    elif kind == "choice":
        _check_choice(v, f"{field}.choice.values", f.choice.values)
    else:
        _check_tagged(v, f"{field}.tagged_json", f.tagged_json, limits)


def _check_json_schema(v: Violations, field: str, text: str, limits: Limits) -> None:
    if not check_text(v, field, text, limits.max_schema_bytes):
        return
    try:
        schema = json.loads(text)
    except (ValueError, RecursionError):
        v.add(field, "must be valid JSON")
        return
    v.require(isinstance(schema, dict | bool), field, "must be a JSON Schema (object)")


def _check_choice(v: Violations, field: str, values: Sequence[str]) -> None:
    if check_repeated(v, field, values, min_items=1, max_items=MAX_CHOICES):
        for i, value in enumerate(values):
            check_text(v, f"{field}[{i}]", value, MAX_CHOICE_BYTES)


def _check_tagged(
    v: Violations, field: str, tagged: common_pb2.TaggedJsonFormat, limits: Limits
) -> None:
    _check_json_schema(v, f"{field}.json_schema", tagged.json_schema, limits)
    for name in ("begin", "end", "separator"):
        check_text(v, f"{field}.{name}", getattr(tagged, name), MAX_CHOICE_BYTES, allow_empty=True)
    check_range(v, f"{field}.max_items", tagged.max_items, min_value=0, max_value=MAX_TAGGED_ITEMS)
