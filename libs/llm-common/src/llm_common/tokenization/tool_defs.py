"""Tool definitions from the wire (common.v1.Tool), checked with field paths, for templates."""

from __future__ import annotations

import re
from collections.abc import Sequence

from llm_common.errors import FieldViolation
from llm_common.tokenization.chat_template import ToolDefinition
from llm_common.tools.jsontext import JsonTextError, load_object
from llm_common.validation import Violations, check_repeated
from llmapi.common.v1 import common_pb2

MAX_TOOLS = 128
MAX_TOOL_NAME_CHARS = 64
TOOL_NAME = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_TOOL_NAME_CHARS}}}")
TOOL_TYPE = "function"  # the only type today; empty means it too


class ToolDataError(ValueError):
    """Tools or tool calls that cannot be passed to a chat template; `violations` hold the
    field paths (`tools[2].function.parameters_json`) for an INVALID_ARGUMENT status."""

    def __init__(self, violations: Sequence[FieldViolation]) -> None:
        self.violations = tuple(violations)
        super().__init__("; ".join(f"{v.field}: {v.description}" for v in self.violations))


def tools_from_proto(
    tools: Sequence[common_pb2.Tool], field: str = "tools", *, max_bytes: int
) -> list[ToolDefinition]:
    """check_tools, raising ToolDataError with every violation instead of collecting them."""
    v = Violations()
    converted = check_tools(v, field, tools, max_bytes=max_bytes)
    if v:
        raise ToolDataError(v.items)
    return converted


def check_tools(
    v: Violations,
    field: str,
    tools: Sequence[common_pb2.Tool],
    *,
    max_tools: int = MAX_TOOLS,
    max_bytes: int,
) -> list[ToolDefinition]:
    """0..max_tools tools with unique valid names; descriptions and parameters_json total at
    most max_bytes of UTF-8; parameters_json empty or a JSON object schema."""
    if not check_repeated(v, field, tools, max_items=max_tools):
        return []
    # Before any parsing, so an oversized request costs no JSON work.
    size = sum(_size(tool.function) for tool in tools)
    if not v.require(
        size <= max_bytes,
        field,
        f"descriptions and parameters_json must total at most {max_bytes} bytes of UTF-8",
    ):
        return []
    converted: list[ToolDefinition] = []
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        path = f"{field}[{i}]"
        name = tool.function.name
        if name in seen:
            v.add(f"{path}.function.name", "is the name of an earlier tool")
        elif TOOL_NAME.fullmatch(name):  # an invalid name is reported once, as invalid
            seen.add(name)
        definition = _tool(v, path, tool)
        if definition is not None:
            converted.append(definition)
    return converted


def _tool(v: Violations, field: str, tool: common_pb2.Tool) -> ToolDefinition | None:
    ok = v.require(tool.type in ("", TOOL_TYPE), f"{field}.type", f'must be "{TOOL_TYPE}"')
    function = tool.function
    ok &= v.require(
        TOOL_NAME.fullmatch(function.name) is not None,
        f"{field}.function.name",
        f"must be 1-{MAX_TOOL_NAME_CHARS} characters of A-Z, a-z, 0-9, _ and -",
    )
    parameters = None
    if function.parameters_json:
        try:
            parameters = _schema(function.parameters_json)
        except JsonTextError as exc:
            v.add(f"{field}.function.parameters_json", str(exc))
            return None
    return ToolDefinition(function.name, function.description, parameters) if ok else None


def _schema(text: str) -> dict[str, object]:
    schema = load_object(text)
    # The arguments are an object, so a schema for anything else can never be met.
    if schema.get("type", "object") != "object":
        raise JsonTextError('must be a JSON Schema of "type": "object"')
    return schema


def _size(function: common_pb2.FunctionDefinition) -> int:
    # Strings of a parsed protobuf are valid UTF-8.
    return sum(
        len(text.encode("utf-8")) for text in (function.description, function.parameters_json)
    )
