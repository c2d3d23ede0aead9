"""Tool calls out of a generation's text: the model family's parser turns each chunk into
content and call fragments, and a finished answer with calls ends with TOOL_CALLS.

Streamed and unary answers take the same path (the unary one assembles the fragments), so a
streamed call reassembles to exactly the unary one. Call ids derive from the request id and
the choice, so a replay (a retry, a cache hit) shows the same ids.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from llm_common.tools import CallDelta, ToolCallParser
from llm_router.generation.relay import Chunk
from llmapi.common.v1 import common_pb2


class ToolCallReader:
    """Reads one choice's chunks for tool calls."""

    def __init__(self, parser: ToolCallParser, id_seed: str) -> None:
        self._stream = parser.stream(seed=id_seed)
        self._calls = 0

    def read(self, chunk: Chunk) -> Chunk:
        """The chunk with its text split into content and call fragments."""
        update = self._stream.feed(chunk.text)
        content, calls = update.content, list(update.calls)
        last = chunk.usage is not None
        if last:
            tail = self._stream.finish()
            content += tail.content
            calls.extend(tail.calls)
        fragments = tuple(calls)
        self._calls = max([self._calls, *(c.index + 1 for c in fragments)])
        finish = chunk.finish_reason
        if last and self._calls and finish == common_pb2.FINISH_REASON_STOP:
            finish = common_pb2.FINISH_REASON_TOOL_CALLS
        return dataclasses.replace(chunk, text=content, tool_calls=fragments, finish_reason=finish)


@dataclass(slots=True)
class _Call:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass(slots=True)
class CallAssembler:
    """Joins streamed call fragments back into whole calls (for unary answers)."""

    _calls: dict[int, _Call] = field(default_factory=dict)

    def add(self, fragments: Sequence[CallDelta]) -> None:
        for fragment in fragments:
            call = self._calls.setdefault(fragment.index, _Call())
            call.id = call.id or fragment.id
            call.name = call.name or fragment.name
            call.arguments.append(fragment.arguments)

    def calls(self) -> list[common_pb2.ToolCall]:
        return [
            common_pb2.ToolCall(
                id=call.id,
                type="function",
                function=common_pb2.FunctionCall(name=call.name, arguments="".join(call.arguments)),
            )
            for _, call in sorted(self._calls.items())
        ]


def call_deltas(fragments: Sequence[CallDelta]) -> list[common_pb2.ToolCallDelta]:
    """Fragments as contract messages."""
    return [
        common_pb2.ToolCallDelta(index=f.index, id=f.id, name=f.name, arguments=f.arguments)
        for f in fragments
    ]
