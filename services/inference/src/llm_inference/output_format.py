"""SamplingParams.format (common.v1.OutputFormat) -> the engine's OutputFormatSpec, and the
service's cheap checks on it (sizes, shape). The engine compiles the format and reports what
the grammar library cannot enforce (InvalidRequest with the field, e.g. an unsupported JSON
Schema keyword and its path)."""

from __future__ import annotations

from llm_common.validation import Violations, check_range, check_repeated, check_text
from llm_inference.engine.api import FormatKind, OutputFormatSpec
from llm_inference.engine.grammar import (
    MAX_CHOICE_BYTES,
    MAX_CHOICES,
    MAX_SPEC_BYTES,
    MAX_TAG_BYTES,
    MAX_TAGGED_ITEMS,
)
from llmapi.common.v1 import common_pb2

FIELD = "sampling.format"


def output_format_spec(sampling: common_pb2.SamplingParams) -> OutputFormatSpec | None:
    """The engine's spec of a (validated) format; None when the request sets none."""
    if not sampling.HasField("format"):
        return None
    given = sampling.format
    kind = given.WhichOneof("format")
    if kind == "json_object":
        return OutputFormatSpec(FormatKind.JSON_OBJECT)
    if kind == "choice":
        return OutputFormatSpec(FormatKind.CHOICE, choices=tuple(given.choice.values))
    if kind == "tagged_json":
        tagged = given.tagged_json
        return OutputFormatSpec(
            FormatKind.TAGGED_JSON,
            spec=tagged.json_schema,
            begin=tagged.begin,
            end=tagged.end,
            separator=tagged.separator,
            max_items=max(tagged.max_items, 1),
        )
    if kind in ("json_schema", "regex", "grammar"):
        return OutputFormatSpec(FormatKind(kind), spec=getattr(given, kind))
    return None


def check_output_format(v: Violations, sampling: common_pb2.SamplingParams) -> None:
    """One kind set, within the size limits; violations are named sampling.format.<kind>."""
    if not sampling.HasField("format"):
        return
    given = sampling.format
    kind = given.WhichOneof("format")
    v.require(
        not sampling.ignore_eos,
        "sampling.ignore_eos",
        "cannot be combined with sampling.format: the format decides where the output ends",
    )
    if kind is None:
        v.add(FIELD, "set one of json_object, json_schema, regex, grammar, choice, tagged_json")
    elif kind == "json_object":
        v.require(given.json_object, f"{FIELD}.json_object", "must be true when set")
    elif kind in ("json_schema", "regex", "grammar"):
        check_text(v, f"{FIELD}.{kind}", getattr(given, kind), MAX_SPEC_BYTES)
    elif kind == "choice":
        _check_choice(v, given.choice)
    else:
        _check_tagged(v, given.tagged_json)


def _check_choice(v: Violations, choice: common_pb2.ChoiceFormat) -> None:
    field = f"{FIELD}.choice.values"
    if check_repeated(v, field, choice.values, min_items=1, max_items=MAX_CHOICES):
        for i, value in enumerate(choice.values):
            check_text(v, f"{field}[{i}]", value, MAX_CHOICE_BYTES)


def _check_tagged(v: Violations, tagged: common_pb2.TaggedJsonFormat) -> None:
    field = f"{FIELD}.tagged_json"
    check_text(v, f"{field}.json_schema", tagged.json_schema, MAX_SPEC_BYTES, allow_empty=True)
    for name in ("begin", "end", "separator"):
        check_text(v, f"{field}.{name}", getattr(tagged, name), MAX_TAG_BYTES, allow_empty=True)
    check_range(v, f"{field}.max_items", tagged.max_items, min_value=0, max_value=MAX_TAGGED_ITEMS)
