"""sampling.format -> OutputFormatSpec, and the service's cheap checks (through generate_input)."""

from __future__ import annotations

import pytest

from llm_common.errors import InvalidArgument
from llm_inference.config import Limits
from llm_inference.deployment import ModelFacts
from llm_inference.engine.api import FormatKind, OutputFormatSpec
from llm_inference.validation import generate_input
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as pb

FACTS = ModelFacts(vocab_size=100, max_context=64, default_max_tokens=16)


def request(fmt: common_pb2.OutputFormat | None, *, ignore_eos: bool = False) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id="req-1",
        prompt_token_ids=[1, 2, 3],
        sampling=common_pb2.SamplingParams(format=fmt, ignore_eos=ignore_eos),
    )


@pytest.mark.parametrize(
    ("fmt", "spec"),
    [
        (None, None),
        (common_pb2.OutputFormat(json_object=True), OutputFormatSpec(FormatKind.JSON_OBJECT)),
        (
            common_pb2.OutputFormat(json_schema='{"type": "integer"}'),
            OutputFormatSpec(FormatKind.JSON_SCHEMA, '{"type": "integer"}'),
        ),
        (common_pb2.OutputFormat(regex="a+"), OutputFormatSpec(FormatKind.REGEX, "a+")),
        (
            common_pb2.OutputFormat(grammar='root ::= "a"'),
            OutputFormatSpec(FormatKind.GRAMMAR, 'root ::= "a"'),
        ),
        (
            common_pb2.OutputFormat(choice=common_pb2.ChoiceFormat(values=["a", "b"])),
            OutputFormatSpec(FormatKind.CHOICE, choices=("a", "b")),
        ),
        (
            common_pb2.OutputFormat(
                tagged_json=common_pb2.TaggedJsonFormat(
                    begin="<t>", json_schema="{}", end="</t>", separator=",", max_items=0
                )
            ),
            OutputFormatSpec(
                FormatKind.TAGGED_JSON, "{}", begin="<t>", end="</t>", separator=",", max_items=1
            ),
        ),
    ],
)
def test_formats_map_to_engine_specs(
    fmt: common_pb2.OutputFormat | None, spec: OutputFormatSpec | None
) -> None:
    assert generate_input(request(fmt), FACTS, Limits()).sampling.output_format == spec


@pytest.mark.parametrize(
    ("fmt", "field"),
    [
        (common_pb2.OutputFormat(), "sampling.format"),
        (common_pb2.OutputFormat(json_object=False), "sampling.format.json_object"),
        (common_pb2.OutputFormat(json_schema=""), "sampling.format.json_schema"),
        (common_pb2.OutputFormat(regex="a" * (64 * 1024 + 1)), "sampling.format.regex"),
        (
            common_pb2.OutputFormat(choice=common_pb2.ChoiceFormat(values=[])),
            "sampling.format.choice.values",
        ),
        (
            common_pb2.OutputFormat(choice=common_pb2.ChoiceFormat(values=["a", "b" * 1025])),
            "sampling.format.choice.values[1]",
        ),
        (
            common_pb2.OutputFormat(tagged_json=common_pb2.TaggedJsonFormat(end="x" * 1025)),
            "sampling.format.tagged_json.end",
        ),
    ],
)
def test_format_violations_name_the_field(fmt: common_pb2.OutputFormat, field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        generate_input(request(fmt), FACTS, Limits())
    assert [v.field for v in caught.value.violations] == [field]


def test_ignore_eos_cannot_go_with_a_format() -> None:
    with pytest.raises(InvalidArgument) as caught:
        generate_input(
            request(common_pb2.OutputFormat(json_object=True), ignore_eos=True), FACTS, Limits()
        )
    assert [v.field for v in caught.value.violations] == ["sampling.ignore_eos"]
