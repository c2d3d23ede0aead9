"""Chat-message checks: field paths, roles, tool calls and results, limits."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from llm_common.tokenization.chat_template import ChatMessage, MessageToolCall
from llm_common.tokenization.messages import check_messages, messages_from_proto
from llm_common.tokenization.tool_defs import ToolDataError
from llm_common.validation import Violations
from llmapi.common.v1 import common_pb2


def check(v: Violations, messages: Sequence[common_pb2.ChatMessage]) -> list[ChatMessage]:
    return check_messages(v, "messages", messages, max_messages=2, max_text_bytes=8)


def violations(v: Violations) -> list[tuple[str, str]]:
    return [(item.field, item.description) for item in v.items]


def message(role: int, content: str = "hi", name: str = "") -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(role=role, content=content, name=name)  # type: ignore[arg-type]


def test_messages_roles_and_conversion() -> None:
    v = Violations()
    converted = check(v, [message(common_pb2.ROLE_SYSTEM, name="n"), message(0)])
    assert violations(v) == [
        ("messages[1].role", "must be one of ROLE_SYSTEM, ROLE_USER, ROLE_ASSISTANT, ROLE_TOOL")
    ]
    assert converted[0].role == "system"
    assert converted[0].name == "n"
    v = Violations()
    check(v, [message(99)])
    assert [f for f, _ in violations(v)] == ["messages[0].role"]


def test_messages_limits() -> None:
    v = Violations()
    check(v, [])
    assert violations(v) == [("messages", "must not be empty")]
    v = Violations()
    check(v, [message(2)] * 3)
    assert violations(v) == [("messages", "at most 2 messages")]
    v = Violations()
    check(v, [message(2, "12345"), message(3, "1234")])
    assert [f for f, _ in violations(v)] == ["messages"]


def tool_call(name: str = "f", arguments: str = '{"a": 1}', **kw: str) -> common_pb2.ToolCall:
    function = common_pb2.FunctionCall(name=name, arguments=arguments)
    return common_pb2.ToolCall(
        id=kw.get("id", "call_1"), type=kw.get("type", ""), function=function
    )


def test_tool_calls_and_results_are_converted() -> None:
    v = Violations()
    assistant = common_pb2.ChatMessage(
        role=common_pb2.ROLE_ASSISTANT, tool_calls=[tool_call(), tool_call("g", "")]
    )
    result = common_pb2.ChatMessage(role=common_pb2.ROLE_TOOL, content="1", tool_call_id="call_1")
    converted = check_messages(v, "m", [assistant, result], max_messages=2, max_text_bytes=99)
    assert not v
    assert converted[0] == ChatMessage(
        "assistant",
        "",
        tool_calls=(MessageToolCall("call_1", "f", {"a": 1}), MessageToolCall("call_1", "g", {})),
    )
    assert converted[1].tool_call_id == "call_1"


@pytest.mark.parametrize(
    ("message", "field", "description"),
    [
        (
            common_pb2.ChatMessage(
                role=common_pb2.ROLE_ASSISTANT, tool_calls=[tool_call(arguments="[1]")]
            ),
            "messages[0].tool_calls[0].function.arguments",
            "must be a JSON object",
        ),
        (
            common_pb2.ChatMessage(
                role=common_pb2.ROLE_ASSISTANT, tool_calls=[tool_call(arguments="{")]
            ),
            "messages[0].tool_calls[0].function.arguments",
            "is not valid JSON: Expecting property name enclosed in double quotes",
        ),
        (
            common_pb2.ChatMessage(role=common_pb2.ROLE_ASSISTANT, tool_calls=[tool_call(name="")]),
            "messages[0].tool_calls[0].function.name",
            "is required",
        ),
        (
            common_pb2.ChatMessage(
                role=common_pb2.ROLE_ASSISTANT, tool_calls=[tool_call(type="x")]
            ),
            "messages[0].tool_calls[0].type",
            'must be "function"',
        ),
        (
            common_pb2.ChatMessage(role=common_pb2.ROLE_USER, tool_calls=[tool_call()]),
            "messages[0].tool_calls",
            "are only for assistant messages",
        ),
        (
            common_pb2.ChatMessage(role=common_pb2.ROLE_USER, tool_call_id="c"),
            "messages[0].tool_call_id",
            "is only for tool messages",
        ),
    ],
)
def test_bad_tool_data_has_field_paths(
    message: common_pb2.ChatMessage, field: str, description: str
) -> None:
    v = Violations()
    check_messages(v, "messages", [message], max_messages=1, max_text_bytes=99)
    assert violations(v) == [(field, description)]
    with pytest.raises(ToolDataError) as err:
        messages_from_proto([message])
    assert [(item.field, item.description) for item in err.value.violations] == [
        (field, description)
    ]
    assert isinstance(err.value, ValueError)
    assert field in str(err.value)


def test_tool_call_text_counts_towards_the_size_limit() -> None:
    v = Violations()
    call = tool_call(arguments='{"long": "argument"}')
    check(v, [common_pb2.ChatMessage(role=common_pb2.ROLE_ASSISTANT, tool_calls=[call])])
    assert [f for f, _ in violations(v)] == ["messages"]
