"""Request checks: field paths and limits."""

from __future__ import annotations

import pytest

from llm_common.errors import FieldViolation
from llm_common.validation import Violations
from llm_tokenizer import validation
from llm_tokenizer.config import Limits
from llmapi.common.v1 import common_pb2

LIMITS = Limits(max_batch=3, max_text_bytes=8, max_ids_per_sequence=4, max_messages=2)


@pytest.mark.parametrize(
    ("text", "max_bytes", "exceeds"),
    [
        ("", 0, False),
        ("abcd", 4, False),
        ("abcde", 4, True),
        ("é", 2, False),  # 2 bytes
        ("é", 1, True),
        ("👍", 4, False),  # 4 bytes, decided by the 4-bytes-per-char bound
        ("a👍", 4, True),  # 5 bytes, needs the exact count
        ("中中", 6, False),
        ("中中", 5, True),
    ],
)
def test_utf8_exceeds(text: str, max_bytes: int, exceeds: bool) -> None:
    assert validation.utf8_exceeds(text, max_bytes) is exceeds
    assert (len(text.encode()) > max_bytes) is exceeds


def violations(v: Violations) -> list[tuple[str, str]]:
    return [(item.field, item.description) for item in v.items]


def test_model_is_required() -> None:
    assert violations(validation.start("")) == [("model", "is required")]
    assert not validation.start("m")


def test_texts() -> None:
    v = Violations()
    validation.check_texts(v, "texts", ["ok", "", "123456789", "ééééé"], LIMITS)
    assert violations(v) == [("texts", "at most 3 items")]
    v = Violations()
    validation.check_texts(v, "texts", ["ok", "123456789", "ééééé"], LIMITS)
    assert [f for f, _ in violations(v)] == ["texts[1]", "texts[2]"]
    v = Violations()
    validation.check_texts(v, "texts", [], LIMITS)
    assert violations(v) == [("texts", "must not be empty")]


def test_sequences_and_ids() -> None:
    v = Violations()
    validation.check_sequence_sizes(v, "sequences", [[1], [1, 2, 3, 4, 5], []], LIMITS)
    assert violations(v) == [("sequences[1].ids", "at most 4 ids")]
    v = Violations()
    validation.check_ids(v, "sequences", [[0, 9], [1, 10, 11], [], [2, -1]], vocab_size=10)
    assert violations(v) == [
        ("sequences[1].ids[1]", "10 is outside the vocabulary [0, 10)"),
        ("sequences[3].ids[1]", "-1 is outside the vocabulary [0, 10)"),
    ]


def test_messages_under_the_service_limits() -> None:
    # The checks themselves are llm_common.tokenization.messages' (tested there).
    v = Violations()
    chat = [common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content="12345")] * 2
    validation.check_messages(v, "messages", chat, LIMITS)
    assert violations(v) == [("messages", "content and names must total at most 8 bytes of UTF-8")]
    v = Violations()
    validation.check_messages(v, "messages", chat * 2, LIMITS)
    assert violations(v) == [("messages", "at most 2 messages")]


def test_tools_under_the_service_limits() -> None:
    # The checks themselves are llm_common.tokenization.tool_defs' (tested there).
    described = common_pb2.FunctionDefinition(name="f", description="123456789")
    v = Violations()
    validation.check_tools(v, "tools", [common_pb2.Tool(function=described)], LIMITS)
    assert violations(v) == [
        ("tools", "descriptions and parameters_json must total at most 8 bytes of UTF-8")
    ]
    v = Violations()
    assert not validation.check_tools_with_messages(v, tools=1, messages=0)
    assert [f for f, _ in violations(v)] == ["tools"]
    assert validation.check_tools_with_messages(Violations(), tools=1, messages=1)
    assert validation.check_tools_with_messages(Violations(), tools=0, messages=0)


@pytest.mark.parametrize(
    ("texts", "messages", "field"),
    [(0, 0, "texts"), (1, 1, "messages"), (1, 0, None), (0, 1, None)],
)
def test_one_of_texts_or_messages(texts: int, messages: int, field: str | None) -> None:
    v = Violations()
    assert validation.check_one_of(v, texts, messages) is (field is None)
    assert [item.field for item in v.items] == ([] if field is None else [field])
    assert all(isinstance(item, FieldViolation) for item in v.items)
