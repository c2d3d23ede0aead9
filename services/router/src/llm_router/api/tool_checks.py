"""Validation of tools, tool_choice and the tool fields of chat messages (field paths as sent)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from llm_common.validation import Violations, check_repeated, check_text
from llm_router.config import Limits
from llmapi.common.v1 import common_pb2

_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_CALL_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_TOOL_TYPE = "function"
MAX_DESCRIPTION_BYTES = 4096
MAX_CALLS_PER_MESSAGE = 128


def check_tools(
    v: Violations,
    tools: Sequence[common_pb2.Tool],
    choice: common_pb2.ToolChoice,
    limits: Limits,
) -> None:
    """At most max_tools functions with unique names and object schemas; a tool_choice that
    names one of them, and `required` only with tools."""
    if check_repeated(v, "tools", tools, max_items=limits.max_tools):
        names: set[str] = set()
        for i, tool in enumerate(tools):
            _check_tool(v, f"tools[{i}]", tool, names, limits)
    if choice.function_name:
        v.require(
            choice.function_name in {t.function.name for t in tools},
            "tool_choice.function_name",
            f"names no function of tools: {choice.function_name[:64]!r}",
        )
    elif choice.mode == common_pb2.TOOL_CHOICE_MODE_REQUIRED:
        v.require(bool(tools), "tool_choice.mode", "required needs at least one tool")


def _check_tool(
    v: Violations, field: str, tool: common_pb2.Tool, seen: set[str], limits: Limits
) -> None:
    v.require(tool.type in ("", _TOOL_TYPE), f"{field}.type", 'must be "function"')
    function = tool.function
    name = function.name
    if v.require(
        _FUNCTION_NAME.fullmatch(name) is not None,
        f"{field}.function.name",
        "must be 1-64 characters of [A-Za-z0-9_-]",
    ):
        v.require(name not in seen, f"{field}.function.name", f"duplicates {name!r}")
        seen.add(name)
    check_text(
        v,
        f"{field}.function.description",
        function.description,
        MAX_DESCRIPTION_BYTES,
        allow_empty=True,
    )
    if function.parameters_json:
        _check_schema_text(v, f"{field}.function.parameters_json", function.parameters_json, limits)


def _check_schema_text(v: Violations, field: str, text: str, limits: Limits) -> None:
    if not check_text(v, field, text, limits.max_schema_bytes):
        return
    try:
        schema = json.loads(text)
    except (ValueError, RecursionError):
        v.add(field, "must be a JSON object (a JSON Schema)")
        return
    if not isinstance(schema, dict):
        v.add(field, "must be a JSON object (a JSON Schema)")
    elif schema.get("type", "object") != "object":
        v.add(field, 'must describe an object ("type": "object")')


def check_tool_messages(v: Violations, messages: Sequence[common_pb2.ChatMessage]) -> None:
    """Calls only on assistant messages, with ids, names and JSON-object arguments; tool
    messages answer a call made earlier in the conversation."""
    call_ids: set[str] = set()
    for i, message in enumerate(messages):
        field = f"messages[{i}]"
        if message.tool_calls:
            _check_calls(v, field, message, call_ids)
        if message.role == common_pb2.ROLE_TOOL:
            if v.require(bool(message.tool_call_id), f"{field}.tool_call_id", "is required"):
                v.require(
                    message.tool_call_id in call_ids,
                    f"{field}.tool_call_id",
                    "answers no tool call of an earlier assistant message",
                )
        elif message.tool_call_id:
            v.add(f"{field}.tool_call_id", "is only for tool messages")


def _check_calls(
    v: Violations, field: str, message: common_pb2.ChatMessage, call_ids: set[str]
) -> None:
    if not v.require(
        message.role == common_pb2.ROLE_ASSISTANT,
        f"{field}.tool_calls",
        "only assistant messages carry tool calls",
    ):
        return
    if not check_repeated(
        v, f"{field}.tool_calls", message.tool_calls, max_items=MAX_CALLS_PER_MESSAGE
    ):
        return
    for j, call in enumerate(message.tool_calls):
        path = f"{field}.tool_calls[{j}]"
        if v.require(
            _CALL_ID.fullmatch(call.id) is not None,
            f"{path}.id",
            "must be 1-128 characters of [A-Za-z0-9._:-]",
        ):
            call_ids.add(call.id)
        v.require(call.type in ("", _TOOL_TYPE), f"{path}.type", 'must be "function"')
        v.require(
            _FUNCTION_NAME.fullmatch(call.function.name) is not None,
            f"{path}.function.name",
            "must be 1-64 characters of [A-Za-z0-9_-]",
        )
        v.require(
            _is_json_object(call.function.arguments),
            f"{path}.function.arguments",
            "must be a JSON object",
        )


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except (ValueError, RecursionError):
        return False
