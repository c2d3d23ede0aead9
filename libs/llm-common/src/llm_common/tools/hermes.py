"""Hermes/Qwen tool calls: <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call> blocks.

Text outside valid blocks is content, except whitespace that touches a valid block (the
newlines around and between calls are layout, not an answer). A block whose JSON is not a
call object stays content, tags and all. A block still open at the end of the output counts
as a call when its JSON is complete (models often stop before the closing tag), else as
content. Nothing ever raises on model output.
"""

from __future__ import annotations

from llm_common.tools.calls import CallNumbering, FoundCall, call_from_text
from llm_common.tools.types import CallDelta, ParsedOutput, StreamUpdate, collect

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


class HermesParser:
    """ToolCallParser for "hermes"; parse() is the stream fed the whole text at once, so
    streamed and unary results agree by construction."""

    def parse(self, text: str, *, seed: bytes | str = "") -> ParsedOutput:
        stream = self.stream(seed=seed)
        return collect((stream.feed(text), stream.finish()))

    def stream(self, *, seed: bytes | str = "") -> HermesStream:
        return HermesStream(seed)


class HermesStream:
    """Emits content as soon as it cannot be part of a call; a call once its block closes."""

    def __init__(self, seed: bytes | str) -> None:
        self._numbering = CallNumbering(seed)
        self._pending = ""  # undecided text: a held tail of content, or the open block's body
        self._in_block = False
        self._held_space = ""  # whitespace before the open tag: layout if the block is a call
        self._after_call = False  # whitespace right after a call is layout
        self._scan_from = 0  # where the open block's body may still hold CLOSE

    def feed(self, delta: str) -> StreamUpdate:
        self._pending += delta
        content: list[str] = []
        calls: list[CallDelta] = []
        while self._step(content, calls):
            pass
        return StreamUpdate("".join(content), tuple(calls))

    def finish(self) -> StreamUpdate:
        update = self._flush()
        # A finished stream holds nothing (a stray feed after it starts afresh as content).
        self._pending, self._held_space = "", ""
        self._in_block = self._after_call = False
        return update

    def _flush(self) -> StreamUpdate:
        if not self._in_block:
            tail = self._pending.lstrip() if self._after_call else self._pending
            return StreamUpdate(tail, ())
        call = call_from_text(self._pending)
        if call is None:
            return StreamUpdate(self._held_space + OPEN + self._pending, ())
        return StreamUpdate("", (self._numbering.delta(call),))

    def _step(self, content: list[str], calls: list[CallDelta]) -> bool:
        """Decide what can be decided; True while another step may decide more."""
        if self._in_block:
            return self._close_block(content, calls)
        return self._read_content(content)

    def _read_content(self, content: list[str]) -> bool:
        if self._after_call:
            self._pending = self._pending.lstrip()
            if not self._pending:
                return False
            self._after_call = False
        start = self._pending.find(OPEN)
        if start < 0:
            # Hold back trailing whitespace and a possible start of OPEN.
            end = len(self._pending) - _partial_tag(self._pending, OPEN)
            text = self._pending[:end].rstrip()
            content.append(text)
            self._pending = self._pending[len(text) :]
            return False
        before = self._pending[:start]
        text = before.rstrip()
        content.append(text)
        self._held_space = before[len(text) :]
        self._pending = self._pending[start + len(OPEN) :]
        self._in_block = True
        self._scan_from = 0
        return True

    def _close_block(self, content: list[str], calls: list[CallDelta]) -> bool:
        end = self._pending.find(CLOSE, self._scan_from)
        if end < 0:
            self._scan_from = max(0, len(self._pending) - len(CLOSE) + 1)
            return False
        body = self._pending[:end]
        self._pending = self._pending[end + len(CLOSE) :]
        self._in_block = False
        call: FoundCall | None = call_from_text(body)
        if call is None:
            content.append(self._held_space + OPEN + body + CLOSE)
        else:
            calls.append(self._numbering.delta(call))
            self._after_call = True
        self._held_space = ""
        return True


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest proper prefix of `tag` that `text` ends with."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0
