"""tools, tool_choice, parallel_tool_calls and tool-call messages -> ChatRequest, and the 400s."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llm_router.api.openai_http import translate
from llm_router.api.openai_http.errors import OpenAIError
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather",
        "parameters": WEATHER_PARAMETERS,
        "strict": True,
    },
}
CLOCK = {"type": "function", "function": {"name": "now"}}
CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":"Paris","unit":"c"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "18C"}]},
]


def request(**fields: Any) -> pb.ChatRequest:
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], **fields}
    return pb.ChatRequest(**translate.chat_call(body).fields)


def rejected(**fields: Any) -> OpenAIError:
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], **fields}
    with pytest.raises(OpenAIError) as err:
        translate.chat_call(body)
    assert err.value.status == 400
    return err.value


def test_tools_map_with_parameters_as_compact_json() -> None:
    req = request(tools=[WEATHER, CLOCK], parallel_tool_calls=False)
    weather, clock = req.tools
    assert (weather.type, weather.function.name) == ("function", "get_weather")
    assert weather.function.description == "Current weather"
    assert weather.function.strict
    assert json.loads(weather.function.parameters_json) == WEATHER_PARAMETERS
    assert " " not in weather.function.parameters_json
    assert (clock.function.parameters_json, clock.function.strict) == ("", False)
    assert req.HasField("parallel_tool_calls")
    assert not req.parallel_tool_calls
    assert not req.HasField("tool_choice")


def test_streaming_requests_take_the_same_tool_fields() -> None:
    body = {"model": "demo", "messages": CONVERSATION, "tools": [WEATHER], "stream": True}
    req = pb.ChatStreamRequest(**translate.chat_call(body).fields)
    assert req.tools[0].function.name == "get_weather"
    assert not req.HasField("parallel_tool_calls")  # unset: the router's default (true)


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("none", common_pb2.ToolChoice(mode=common_pb2.TOOL_CHOICE_MODE_NONE)),
        ("auto", common_pb2.ToolChoice(mode=common_pb2.TOOL_CHOICE_MODE_AUTO)),
        ("required", common_pb2.ToolChoice(mode=common_pb2.TOOL_CHOICE_MODE_REQUIRED)),
        (
            {"type": "function", "function": {"name": "now"}},
            common_pb2.ToolChoice(function_name="now"),
        ),
    ],
)
def test_tool_choice(choice: Any, expected: common_pb2.ToolChoice) -> None:
    assert request(tools=[WEATHER, CLOCK], tool_choice=choice).tool_choice == expected


def test_tool_choice_none_needs_no_tools() -> None:
    assert request(tool_choice="none").tool_choice.mode == common_pb2.TOOL_CHOICE_MODE_NONE


def test_a_tool_call_conversation() -> None:
    user, assistant, tool = request(messages=CONVERSATION, tools=[WEATHER]).messages
    assert assistant.role == common_pb2.ROLE_ASSISTANT
    assert assistant.content == ""
    (call,) = assistant.tool_calls
    assert (call.id, call.type, call.function.name) == ("call_1", "function", "get_weather")
    assert json.loads(call.function.arguments) == {"city": "Paris", "unit": "c"}
    assert (tool.role, tool.tool_call_id, tool.content) == (common_pb2.ROLE_TOOL, "call_1", "18C")
    assert user.tool_call_id == ""


def test_an_assistant_message_may_have_text_and_calls() -> None:
    message = {**CONVERSATION[1], "content": "Let me look."}
    (assistant,) = request(messages=[message]).messages
    assert (assistant.content, len(assistant.tool_calls)) == ("Let me look.", 1)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"tools": {"a": 1}}, "tools"),
        ({"tools": [CLOCK] * 129}, "tools"),
        ({"tools": ["now"]}, "tools[0]"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0].type"),
        ({"tools": [{"type": "function", "function": "now"}]}, "tools[0].function"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools[0].function.name"),
        (
            {"tools": [{"type": "function", "function": {"name": "has space"}}]},
            "tools[0].function.name",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "x" * 65}}]},
            "tools[0].function.name",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "parameters": "{}"}}]},
            "tools[0].function.parameters",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "strict": 1}}]},
            "tools[0].function.strict",
        ),
        (
            {"tools": [{"type": "function", "function": {"name": "f", "description": 2}}]},
            "tools[0].function.description",
        ),
        ({"tools": [CLOCK, WEATHER, CLOCK]}, "tools[2].function.name"),
        ({"tool_choice": "auto"}, "tool_choice"),
        ({"tools": [CLOCK], "tool_choice": "always"}, "tool_choice"),
        ({"tools": [CLOCK], "tool_choice": {"type": "function"}}, "tool_choice"),
        (
            {"tools": [CLOCK], "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "tool_choice",
        ),
        (
            {"tools": [CLOCK], "tool_choice": {"type": "function", "function": {"name": {}}}},
            "tool_choice",
        ),
        ({"tools": [CLOCK], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
        ({"functions": [{"name": "f"}]}, "functions"),
        ({"function_call": "auto"}, "function_call"),
    ],
)
def test_bad_tools_name_the_parameter(fields: dict[str, Any], param: str) -> None:
    assert rejected(**fields).param == param


def test_legacy_functions_say_what_to_send_instead() -> None:
    err = rejected(functions=[{"name": "f"}])
    assert err.code == "unsupported_parameter"
    assert "tools" in err.message


def _call(**changes: Any) -> dict[str, Any]:
    call: dict[str, Any] = {
        "id": "c1",
        "type": "function",
        "function": {"name": "f", "arguments": "{}"},
    }
    return call | changes


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "tool", "content": "18C"}, "messages[0].tool_call_id"),
        ({"role": "tool", "tool_call_id": "", "content": "x"}, "messages[0].tool_call_id"),
        ({"role": "tool", "tool_call_id": "c1"}, "messages[0].content"),
        ({"role": "function", "name": "f", "content": "x"}, "messages[0].role"),
        ({"role": "assistant", "content": None}, "messages[0].content"),
        ({"role": "assistant", "content": None, "tool_calls": []}, "messages[0].content"),
        ({"role": "assistant", "tool_calls": "call"}, "messages[0].tool_calls"),
        ({"role": "assistant", "tool_calls": ["c1"]}, "messages[0].tool_calls[0]"),
        ({"role": "assistant", "tool_calls": [_call(id=None)]}, "messages[0].tool_calls[0].id"),
        (
            {"role": "assistant", "tool_calls": [_call(type="custom")]},
            "messages[0].tool_calls[0].type",
        ),
        (
            {"role": "assistant", "tool_calls": [_call(function=None)]},
            "messages[0].tool_calls[0].function",
        ),
        (
            {"role": "assistant", "tool_calls": [_call(function={"arguments": "{}"})]},
            "messages[0].tool_calls[0].function.name",
        ),
        (
            {"role": "assistant", "tool_calls": [_call(function={"name": "f", "arguments": {}})]},
            "messages[0].tool_calls[0].function.arguments",
        ),
        ({"role": "user", "content": "x", "tool_calls": [_call()]}, "messages[0].tool_calls"),
        ({"role": "user", "content": "x", "name": 3}, "messages[0].name"),
    ],
)
def test_bad_messages_name_the_field(message: dict[str, Any], param: str) -> None:
    assert rejected(messages=[message]).param == param
