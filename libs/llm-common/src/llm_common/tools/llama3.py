"""Llama 3.1 JSON tool calls: the whole output is {"name": ..., "parameters": {...}},
optionally after <|python_tag|>, possibly several separated by ';'.

An output is either all calls (content "") or all content (calls none): anything else around
or between the objects, or an object that is not a call, makes the whole text content.
Streaming holds the output back while it may still be calls (it starts with "{" or the
python tag after optional whitespace) and passes it through as content once it cannot be.
"""

from __future__ import annotations

import enum

from llm_common.tools.calls import CallNumbering, FoundCall, call_from_object
from llm_common.tools.jsontext import JsonTextError, raw_decode
from llm_common.tools.types import EMPTY_UPDATE, ParsedOutput, StreamUpdate, collect

PYTHON_TAG = "<|python_tag|>"
SEPARATOR = ";"


class Llama3JsonParser:
    """ToolCallParser for "llama3_json"."""

    def parse(self, text: str, *, seed: bytes | str = "") -> ParsedOutput:
        stream = self.stream(seed=seed)
        return collect((stream.feed(text), stream.finish()))

    def stream(self, *, seed: bytes | str = "") -> Llama3JsonStream:
        return Llama3JsonStream(seed)


class _Mode(enum.Enum):
    UNDECIDED = enum.auto()  # only whitespace or a start of the python tag so far
    HOLDING = enum.auto()  # looks like calls: decided at finish
    CONTENT = enum.auto()  # cannot be calls: passed through


class Llama3JsonStream:
    def __init__(self, seed: bytes | str) -> None:
        self._seed = seed
        self._held: list[str] = []
        self._mode = _Mode.UNDECIDED

    def feed(self, delta: str) -> StreamUpdate:
        if self._mode is _Mode.CONTENT:
            return StreamUpdate(delta, ())
        self._held.append(delta)
        if self._mode is _Mode.HOLDING:
            return EMPTY_UPDATE
        held = "".join(self._held)
        self._held = [held]
        self._mode = _mode_of(held)
        if self._mode is not _Mode.CONTENT:
            return EMPTY_UPDATE
        self._held = []
        return StreamUpdate(held, ())

    def finish(self) -> StreamUpdate:
        text = "".join(self._held)
        self._held = []
        self._mode = _Mode.UNDECIDED
        calls = parse_calls(text)
        if calls is None:
            return StreamUpdate(text, ())
        numbering = CallNumbering(self._seed)
        return StreamUpdate("", tuple(numbering.delta(call) for call in calls))


def _mode_of(text: str) -> _Mode:
    """What an output starting with `text` can still be."""
    head = text.lstrip()
    if head.startswith(PYTHON_TAG):
        head = head[len(PYTHON_TAG) :].lstrip()
    elif PYTHON_TAG.startswith(head):  # also "" (whitespace only so far)
        return _Mode.UNDECIDED
    if not head:
        return _Mode.UNDECIDED
    return _Mode.HOLDING if head.startswith("{") else _Mode.CONTENT


def parse_calls(text: str) -> list[FoundCall] | None:
    """The calls when all of `text` is calls in this format, else None."""
    body = text.strip()
    if body.startswith(PYTHON_TAG):
        body = body[len(PYTHON_TAG) :].lstrip()
    calls: list[FoundCall] = []
    pos = 0
    while pos < len(body):
        try:
            value, pos = raw_decode(body, pos)
        except JsonTextError:
            return None
        call = call_from_object(value)
        if call is None:
            return None
        calls.append(call)
        pos = _skip_space(body, pos)
        if pos < len(body):
            if body[pos] != SEPARATOR:
                return None
            pos = _skip_space(body, pos + 1)  # a trailing ';' is tolerated
    return calls or None


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return pos
