"""The parser registry, call ids and reassembly of streamed fragments."""

from __future__ import annotations

import re

import pytest

from llm_common.tools import (
    DEFAULT_PARSER,
    PARSERS,
    CallDelta,
    ParsedOutput,
    ParsedToolCall,
    StreamUpdate,
    UnknownParserError,
    call_id,
    collect,
    parser_for,
)


def test_known_parsers() -> None:
    assert PARSERS == ("hermes", "llama3_json")
    assert DEFAULT_PARSER in PARSERS
    assert parser_for("hermes") is parser_for("hermes")  # stateless: shared


def test_unknown_parser_is_a_key_and_value_error() -> None:
    with pytest.raises(KeyError):
        parser_for("mistral")
    with pytest.raises(ValueError, match="unknown tool parser 'mistral'; known: hermes, llama3"):
        parser_for("mistral")
    assert issubclass(UnknownParserError, KeyError)


def test_call_ids_are_deterministic_url_safe_and_distinct() -> None:
    first = call_id("req-1", 0)
    assert re.fullmatch(r"call_[A-Za-z0-9_-]{24}", first)
    assert first == call_id(b"req-1", 0)  # str seeds are their UTF-8 bytes
    others = {call_id("req-1", 1), call_id("req-2", 0), call_id("req-10", 0), call_id("", 0)}
    assert first not in others
    assert len(others) == 4


def test_collect_joins_fragments_per_index() -> None:
    updates = [
        StreamUpdate("a", (CallDelta(1, "id1", "g", '{"x"'),)),
        StreamUpdate("b", (CallDelta(0, "id0", "f", "{}"), CallDelta(1, "", "", ":1}"))),
    ]
    assert collect(updates) == ParsedOutput(
        "ab", (ParsedToolCall("id0", "f", "{}"), ParsedToolCall("id1", "g", '{"x":1}'))
    )
