"""forced_format: the tagged_json each parser family needs, and outputs it reads back."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llm_common.tools import MAX_PARALLEL_CALLS, PARSERS, forced_format, parser_for
from llm_common.tools.forced import SYNTAX
from llmapi.common.v1 import common_pb2

WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}}
TOOLS = [
    common_pb2.Tool(
        type="function",
        function=common_pb2.FunctionDefinition(
            name="get_weather", parameters_json=json.dumps(WEATHER_PARAMS)
        ),
    ),
    common_pb2.Tool(function=common_pb2.FunctionDefinition(name="now")),
]


def call_schema(name: str, key: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"name": {"const": name}, key: parameters},
        "required": ["name", key],
        "additionalProperties": False,
    }


def test_every_parser_has_a_call_syntax() -> None:
    assert set(SYNTAX) == set(PARSERS)


def test_hermes_named_function() -> None:
    fmt = forced_format("hermes", TOOLS, function_name="get_weather", parallel=False)
    assert fmt.WhichOneof("format") == "tagged_json"
    tagged = fmt.tagged_json
    assert (tagged.begin, tagged.end, tagged.separator) == ("<tool_call>\n", "\n</tool_call>", "\n")
    assert tagged.max_items == 1
    assert json.loads(tagged.json_schema) == call_schema("get_weather", "arguments", WEATHER_PARAMS)


def test_hermes_required_is_any_tool_and_parallel_allows_several() -> None:
    tagged = forced_format("hermes", TOOLS, function_name=None, parallel=True).tagged_json
    empty = {"type": "object", "properties": {}}
    assert json.loads(tagged.json_schema) == {
        "anyOf": [
            call_schema("get_weather", "arguments", WEATHER_PARAMS),
            call_schema("now", "arguments", empty),
        ]
    }
    assert tagged.max_items == MAX_PARALLEL_CALLS


def test_llama3_json_syntax() -> None:
    tagged = forced_format("llama3_json", TOOLS, function_name="now", parallel=True).tagged_json
    assert (tagged.begin, tagged.end, tagged.separator) == ("", "", "; ")
    empty = {"type": "object", "properties": {}}
    assert json.loads(tagged.json_schema) == call_schema("now", "parameters", empty)


@pytest.mark.parametrize("parser", PARSERS)
def test_outputs_of_the_format_parse_as_calls(parser: str) -> None:
    tagged = forced_format(parser, TOOLS, function_name=None, parallel=True).tagged_json
    key = SYNTAX[parser].arguments_key
    items = [{"name": "get_weather", key: {"city": "Oslo"}}, {"name": "now", key: {}}]
    text = tagged.separator.join(tagged.begin + json.dumps(i) + tagged.end for i in items)
    parsed = parser_for(parser).parse(text)
    assert parsed.content == ""
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("get_weather", '{"city":"Oslo"}'),
        ("now", "{}"),
    ]


@pytest.mark.parametrize(
    ("parser", "tools", "name", "message"),
    [
        ("nope", TOOLS, None, "unknown tool parser 'nope'"),
        ("hermes", TOOLS, "absent", "'absent' is not among"),
        ("hermes", [], None, "no tools"),
    ],
)
def test_rejects(parser: str, tools: list[common_pb2.Tool], name: str | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        forced_format(parser, tools, function_name=name, parallel=False)


def test_bad_parameters_json_is_a_value_error() -> None:
    tool = common_pb2.Tool(function=common_pb2.FunctionDefinition(name="f", parameters_json="[1"))
    with pytest.raises(ValueError, match="not valid JSON"):
        forced_format("hermes", [tool], function_name="f", parallel=False)
