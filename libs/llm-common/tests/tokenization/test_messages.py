"""Chat-message checks: field paths, roles and limits."""

from __future__ import annotations

from collections.abc import Sequence

from llm_common.tokenization.chat_template import ChatMessage
from llm_common.tokenization.messages import check_messages
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
