"""Answers as printed: text, tool calls (reassembled from a stream) and token logprobs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from llmapi.common.v1 import common_pb2


@dataclass(slots=True)
class CallParts:
    """One tool call, whole or as far as its fragments have arrived."""

    id: str = ""
    name: str = ""
    arguments: str = ""

    def line(self) -> str:
        """The call as one JSON line, in OpenAI's tool-call shape."""
        function = {"name": self.name, "arguments": self.arguments}
        return json.dumps({"id": self.id, "type": "function", "function": function})


@dataclass(slots=True)
class Answer:
    """One of the n answers of a request."""

    index: int
    text: str = ""
    calls: list[CallParts] = field(default_factory=list)
    logprobs: list[common_pb2.TokenLogprob] = field(default_factory=list)

    def add_call_deltas(self, deltas: Sequence[common_pb2.ToolCallDelta]) -> None:
        """Fragments of one index concatenate; the first carries the id and name."""
        for d in deltas:
            while len(self.calls) <= d.index:
                self.calls.append(CallParts())
            call = self.calls[d.index]
            call.id = d.id or call.id
            call.name = d.name or call.name
            call.arguments += d.arguments


class Answers:
    """The answers of a stream, by index, as its messages arrive."""

    def __init__(self) -> None:
        self.by_index: dict[int, Answer] = {}

    def add(self, message: Any) -> Answer:
        """A ChatStreamResponse or CompleteStreamResponse."""
        answer = self.by_index.setdefault(message.index, Answer(message.index))
        answer.text += message.delta
        answer.logprobs.extend(message.logprobs)
        answer.add_call_deltas(getattr(message, "tool_calls", ()))
        return answer

    def ordered(self) -> list[Answer]:
        return [self.by_index[i] for i in sorted(self.by_index)]


def unary_answers(reply: Any) -> list[Answer]:
    """Every choice of a ChatResponse or CompleteResponse (the top-level one when n = 1)."""
    choices = list(reply.choices) or [reply]
    return [_answer(getattr(choice, "index", 0), choice) for choice in choices]


def _answer(index: int, choice: Any) -> Answer:
    message = getattr(choice, "message", None)
    text = message.content if message is not None else choice.text
    calls = [
        CallParts(c.id, c.function.name, c.function.arguments)
        for c in (message.tool_calls if message is not None else ())
    ]
    return Answer(index, text, calls, list(choice.logprobs))


def write_tail(answer: Answer, out: TextIO, text_written: bool) -> None:
    """What follows an answer's text: its line end and tool calls, one JSON line each."""
    if text_written or not answer.calls:
        out.write("\n")
    for call in answer.calls:
        out.write(call.line() + "\n")


def write_answers(answers: list[Answer], out: TextIO, info: TextIO) -> None:
    """Whole answers; with several, each under a [choice i] line."""
    for answer in answers:
        if len(answers) > 1:
            out.write(f"[choice {answer.index}]\n")
        out.write(answer.text)
        write_tail(answer, out, bool(answer.text))
        write_logprobs(answer, info, len(answers) > 1)


def write_logprobs(answer: Answer, info: TextIO, numbered: bool = False) -> None:
    """One line per token: the token, its logprob and the alternatives (on stderr)."""
    if not answer.logprobs:
        return
    info.write(f"[logprobs of choice {answer.index}]\n" if numbered else "[logprobs]\n")
    for lp in answer.logprobs:
        line = f"{lp.token!r} {lp.logprob:.4f}"
        if lp.top_logprobs:
            line += "  | " + ", ".join(f"{t.token!r} {t.logprob:.4f}" for t in lp.top_logprobs)
        info.write(line + "\n")
