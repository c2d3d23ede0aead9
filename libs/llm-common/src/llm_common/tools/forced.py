"""Output formats that force tool calls in a parser family's own syntax (constrained decoding)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from llm_common.tools.jsontext import compact, load_object

if TYPE_CHECKING:
    from llmapi.common.v1 import common_pb2

# Calls allowed in one forced output when parallel calls are on.
MAX_PARALLEL_CALLS = 8
# The schema of a function without parameters: an empty arguments object.
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True, slots=True)
class CallSyntax:
    """How a family writes calls: the TaggedJsonFormat around each call object."""

    begin: str
    end: str
    separator: str
    arguments_key: str


SYNTAX = {
    "hermes": CallSyntax("<tool_call>\n", "\n</tool_call>", "\n", "arguments"),
    "llama3_json": CallSyntax("", "", "; ", "parameters"),
}


def forced_format(
    parser: str,
    tools: Sequence[common_pb2.Tool],
    *,
    function_name: str | None,
    parallel: bool,
) -> common_pb2.OutputFormat:
    """A tagged_json format under which the output is 1..max_items calls that `parser` reads.

    `function_name` forces that tool; None forces one of `tools` (anyOf). ValueError for an
    unknown parser, a function_name that is not among tools, no tools, or parameters_json that
    is not a JSON object (validate requests first).
    """
    # Imported here so that llm_common.tools (PARSERS, read by models_config) needs no protos.
    from llmapi.common.v1 import common_pb2

    syntax = SYNTAX.get(parser)
    if syntax is None:
        raise ValueError(f"unknown tool parser {parser!r}; known: {', '.join(SYNTAX)}")
    schema = _schema(syntax, _chosen(tools, function_name), anyof=function_name is None)
    tagged = common_pb2.TaggedJsonFormat(
        begin=syntax.begin,
        json_schema=compact(schema),
        end=syntax.end,
        max_items=MAX_PARALLEL_CALLS if parallel else 1,
        separator=syntax.separator,
    )
    return common_pb2.OutputFormat(tagged_json=tagged)


def call_schema(syntax: CallSyntax, tool: common_pb2.Tool) -> dict[str, Any]:
    """The JSON Schema of one call of `tool` in `syntax`."""
    function = tool.function
    parameters = load_object(function.parameters_json) if function.parameters_json else None
    return {
        "type": "object",
        "properties": {
            "name": {"const": function.name},
            syntax.arguments_key: parameters or EMPTY_PARAMETERS,
        },
        "required": ["name", syntax.arguments_key],
        "additionalProperties": False,
    }


def _chosen(tools: Sequence[common_pb2.Tool], name: str | None) -> list[common_pb2.Tool]:
    if name is None:
        if not tools:
            raise ValueError("no tools to force a call of")
        return list(tools)
    named = [tool for tool in tools if tool.function.name == name]
    if not named:
        raise ValueError(f"function {name!r} is not among the request's tools")
    return named[:1]


def _schema(syntax: CallSyntax, tools: list[common_pb2.Tool], *, anyof: bool) -> dict[str, Any]:
    schemas = [call_schema(syntax, tool) for tool in tools]
    return {"anyOf": schemas} if anyof else schemas[0]
