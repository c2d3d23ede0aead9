"""Tool definitions from the wire: names, schemas, limits, field paths."""

from __future__ import annotations

import json

import pytest

from llm_common.tokenization.chat_template import ToolDefinition
from llm_common.tokenization.tool_defs import (
    MAX_TOOLS,
    ToolDataError,
    check_tools,
    tools_from_proto,
)
from llm_common.validation import Violations
from llmapi.common.v1 import common_pb2

SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}}


def tool(name: str = "search", parameters_json: str = "", **kw: str) -> common_pb2.Tool:
    function = common_pb2.FunctionDefinition(
        name=name, description=kw.get("description", ""), parameters_json=parameters_json
    )
    return common_pb2.Tool(type=kw.get("type", "function"), function=function)


def fields(tools: list[common_pb2.Tool], max_bytes: int = 10_000) -> list[tuple[str, str]]:
    v = Violations()
    check_tools(v, "tools", tools, max_bytes=max_bytes)
    return [(item.field, item.description) for item in v.items]


def test_converts_to_template_definitions() -> None:
    tools = [tool("search", json.dumps(SCHEMA), description="Find"), tool("now-1", type="")]
    assert tools_from_proto(tools, max_bytes=10_000) == [
        ToolDefinition("search", "Find", SCHEMA),
        ToolDefinition("now-1", "", None),
    ]
    assert tools_from_proto([], max_bytes=1) == []


@pytest.mark.parametrize(
    ("tools", "expected"),
    [
        ([tool("")], [("tools[0].function.name", "must be 1-64 characters of")]),
        ([tool("a" * 65)], [("tools[0].function.name", "must be 1-64 characters of")]),
        ([tool("has space")], [("tools[0].function.name", "must be 1-64 characters of")]),
        (
            [tool("a"), tool("b"), tool("a")],
            [("tools[2].function.name", "is the name of an earlier")],
        ),
        ([tool(type="retrieval")], [("tools[0].type", 'must be "function"')]),
        (
            [tool("a", "x"), tool("b", "[]")],
            [
                ("tools[0].function.parameters_json", "is not valid JSON: Expecting value"),
                ("tools[1].function.parameters_json", "must be a JSON object"),
            ],
        ),
        (
            [tool("a", '{"type": "string"}')],
            [("tools[0].function.parameters_json", 'must be a JSON Schema of "type": "object"')],
        ),
        (
            [tool("a", '{"type": "object", "x": NaN}')],
            [("tools[0].function.parameters_json", "is not valid JSON")],
        ),
        (
            [tool("a", '{"type": "object"}')] * 2,
            [("tools[1].function.name", "is the name of an earlier")],
        ),
        ([tool(str(i)) for i in range(MAX_TOOLS + 1)], [("tools", "must have at most 128 items")]),
    ],
)
def test_violations(tools: list[common_pb2.Tool], expected: list[tuple[str, str]]) -> None:
    found = fields(tools)
    assert [f for f, _ in found] == [f for f, _ in expected]
    for (_, description), (_, prefix) in zip(found, expected, strict=True):
        assert description.startswith(prefix)


def test_size_limit_covers_descriptions_and_schemas() -> None:
    tools = [tool("a", json.dumps(SCHEMA), description="é" * 10)]
    size = len(json.dumps(SCHEMA)) + 20
    assert fields(tools, max_bytes=size) == []
    assert fields(tools, max_bytes=size - 1) == [
        ("tools", f"descriptions and parameters_json must total at most {size - 1} bytes of UTF-8")
    ]


def test_tools_from_proto_raises_every_violation() -> None:
    with pytest.raises(ToolDataError) as err:
        tools_from_proto([tool(""), tool("b", "[")], max_bytes=100)
    assert [v.field for v in err.value.violations] == [
        "tools[0].function.name",
        "tools[1].function.parameters_json",
    ]
    assert isinstance(err.value, ValueError)
