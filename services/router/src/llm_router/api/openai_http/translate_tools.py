"""Chat messages (tool calls and tool results included), tools and tool_choice."""

from __future__ import annotations

import re
from typing import Any

from llm_router.api.openai_http.errors import invalid
from llm_router.api.openai_http.values import Payload, compact_json, flag, obj, optional, text
from llmapi.common.v1 import common_pb2

MAX_TOOLS = 128
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_ROLES = {
    "system": common_pb2.ROLE_SYSTEM,
    "developer": common_pb2.ROLE_SYSTEM,
    "user": common_pb2.ROLE_USER,
    "assistant": common_pb2.ROLE_ASSISTANT,
    "tool": common_pb2.ROLE_TOOL,
}
_MODES = {
    "none": common_pb2.TOOL_CHOICE_MODE_NONE,
    "auto": common_pb2.TOOL_CHOICE_MODE_AUTO,
    "required": common_pb2.TOOL_CHOICE_MODE_REQUIRED,
}
# The deprecated function-calling surface: its answers would need `function_call` messages.
_LEGACY = ("functions", "function_call")


def tool_fields(payload: Payload) -> dict[str, Any]:
    """tools, tool_choice and parallel_tool_calls as ChatRequest keyword arguments."""
    _reject_legacy(payload)
    tools = _tools(payload)
    fields: dict[str, Any] = {"tools": tools}
    choice = _tool_choice(payload, {t.function.name for t in tools})
    if choice is not None:
        fields["tool_choice"] = choice
    if payload.get("parallel_tool_calls") is not None:
        fields["parallel_tool_calls"] = flag(payload, "parallel_tool_calls")
    return fields


def _reject_legacy(payload: Payload) -> None:
    for name in _LEGACY:
        if payload.get(name):
            raise invalid(
                f"{name} is deprecated and not supported; send tools and tool_choice instead",
                name,
                "unsupported_parameter",
            )


def _tools(payload: Payload) -> list[common_pb2.Tool]:
    raw = payload.get("tools")
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise invalid(f"tools must be a list of at most {MAX_TOOLS} tools", "tools")
    tools = [_tool(item, f"tools[{i}]") for i, item in enumerate(raw)]
    seen: set[str] = set()
    for i, tool in enumerate(tools):
        if tool.function.name in seen:
            name = tool.function.name
            raise invalid(f"tool {name!r} is defined twice", f"tools[{i}].function.name")
        seen.add(tool.function.name)
    return tools


def _tool(item: Any, param: str) -> common_pb2.Tool:
    if not isinstance(item, dict):
        raise invalid(f"{param} must be an object", param)
    if item.get("type") != "function":
        raise invalid(f"{param}.type must be function", f"{param}.type")
    function = obj(item, "function", f"{param}.function")
    if function is None:
        raise invalid(f"{param}.function is required", f"{param}.function")
    return common_pb2.Tool(type="function", function=_function_definition(function, param))


def _function_definition(function: Payload, param: str) -> common_pb2.FunctionDefinition:
    """{name, description, parameters, strict}; parameters travel as compact JSON text."""
    name = function.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        raise invalid(
            f"{param}.function.name must be 1-64 characters of [A-Za-z0-9_-]",
            f"{param}.function.name",
        )
    params_param = f"{param}.function.parameters"
    parameters = obj(function, "parameters", params_param)
    return common_pb2.FunctionDefinition(
        name=name,
        description=text(function, "description", f"{param}.function.description"),
        parameters_json="" if parameters is None else compact_json(parameters, params_param),
        strict=flag(function, "strict", f"{param}.function.strict"),
    )


def _tool_choice(payload: Payload, names: set[str]) -> common_pb2.ToolChoice | None:
    """A mode (none, auto, required) or {"type": "function", "function": {"name": ...}}."""
    raw = payload.get("tool_choice")
    if raw is None:
        return None
    if raw != "none" and not names:
        raise invalid("tool_choice is only allowed when tools are given", "tool_choice")
    if isinstance(raw, str) and raw in _MODES:
        return common_pb2.ToolChoice(mode=_MODES[raw])
    function = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or raw.get("type") != "function" or not isinstance(function, dict):
        raise invalid(
            'tool_choice must be "none", "auto", "required" or '
            '{"type": "function", "function": {"name": ...}}',
            "tool_choice",
        )
    name = function.get("name")
    if not isinstance(name, str) or name not in names:
        raise invalid(f"tool_choice names {name!r}, which is not one of the tools", "tool_choice")
    return common_pb2.ToolChoice(function_name=name)


def messages(payload: Payload) -> list[common_pb2.ChatMessage]:
    raw = payload.get("messages")
    if not isinstance(raw, list) or not raw:
        raise invalid("messages must be a non-empty list", "messages")
    return [_message(message, f"messages[{i}]") for i, message in enumerate(raw)]


def _message(message: Any, param: str) -> common_pb2.ChatMessage:
    if not isinstance(message, dict):
        raise invalid("each message must be an object", param)
    role_name = message.get("role")
    if role_name == "function":
        raise invalid(
            "function messages are deprecated; answer a tool call with role tool and its "
            "tool_call_id",
            f"{param}.role",
        )
    role = _ROLES.get(role_name) if isinstance(role_name, str) else None
    if role is None:
        raise invalid(f"unsupported role {role_name!r}", f"{param}.role")
    converted = common_pb2.ChatMessage(role=role, name=text(message, "name", f"{param}.name"))
    if role == common_pb2.ROLE_ASSISTANT:
        converted.tool_calls.extend(_tool_calls(message, param))
    elif message.get("tool_calls"):
        raise invalid("only assistant messages have tool_calls", f"{param}.tool_calls")
    if role == common_pb2.ROLE_TOOL:
        converted.tool_call_id = _tool_call_id(message, param)
    # An assistant message that only calls tools may have null content.
    content = message.get("content")
    if content is not None or not converted.tool_calls:
        converted.content = _content(content, f"{param}.content")
    return converted


def _tool_call_id(message: Payload, param: str) -> str:
    value = message.get("tool_call_id")
    if not isinstance(value, str) or not value:
        raise invalid("tool messages need the tool_call_id they answer", f"{param}.tool_call_id")
    return value


def _tool_calls(message: Payload, param: str) -> list[common_pb2.ToolCall]:
    raw = optional(message, "tool_calls", list, "a list", f"{param}.tool_calls") or []
    return [_tool_call(call, f"{param}.tool_calls[{j}]") for j, call in enumerate(raw)]


def _tool_call(call: Any, param: str) -> common_pb2.ToolCall:
    """{id, type: "function", function: {name, arguments (JSON text)}}."""
    if not isinstance(call, dict):
        raise invalid(f"{param} must be an object", param)
    if call.get("type", "function") != "function":
        raise invalid(f"{param}.type must be function", f"{param}.type")
    call_id, function = call.get("id"), call.get("function")
    if not isinstance(call_id, str) or not call_id:
        raise invalid(f"{param}.id must be a non-empty string", f"{param}.id")
    if not isinstance(function, dict):
        raise invalid(f"{param}.function must be an object", f"{param}.function")
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(name, str) or not name:
        raise invalid(f"{param}.function.name must be a string", f"{param}.function.name")
    if not isinstance(arguments, str):
        raise invalid(
            f"{param}.function.arguments must be a JSON text (a string)",
            f"{param}.function.arguments",
        )
    return common_pb2.ToolCall(
        id=call_id,
        type="function",
        function=common_pb2.FunctionCall(name=name, arguments=arguments),
    )


def _content(content: Any, param: str) -> str:
    """A string, or a list of text parts (joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise invalid("only text content parts are supported", param)
            texts.append(part["text"])
        return "".join(texts)
    raise invalid("each message needs text content", param)
