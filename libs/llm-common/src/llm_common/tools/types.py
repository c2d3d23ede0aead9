"""What tool-call parsers return, the streaming protocol, and deterministic call ids."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

CALL_ID_PREFIX = "call_"


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    """One call the model made; `arguments` is the compact JSON text of an object."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ParsedOutput:
    """A whole output split into the text for the user and the calls."""

    content: str
    tool_calls: tuple[ParsedToolCall, ...]


@dataclass(frozen=True, slots=True)
class CallDelta:
    """A fragment of call `index`, like common.v1.ToolCallDelta: id and name on the first
    fragment only, arguments pieces that concatenate to the call's arguments."""

    index: int
    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class StreamUpdate:
    """Text that is certainly content, and call fragments, decided by one feed or finish."""

    content: str
    calls: tuple[CallDelta, ...]


EMPTY_UPDATE = StreamUpdate("", ())


class ToolStream(Protocol):
    def feed(self, delta: str) -> StreamUpdate:
        """Take the next piece of generated text; hold back what may still become a call."""
        ...

    def finish(self) -> StreamUpdate:
        """The end of generation: flush everything held back."""
        ...


class ToolCallParser(Protocol):
    """Splits one model family's output into content and calls; never raises on model output.

    `seed` makes the call ids: call i gets call_id(seed, i). Pass something unique per
    generated output (request id and choice index) so that ids differ between turns; the
    same seed (a replay, a cached response) gives the same ids.
    """

    def parse(self, text: str, *, seed: bytes | str = "") -> ParsedOutput: ...

    def stream(self, *, seed: bytes | str = "") -> ToolStream: ...


def call_id(seed: bytes | str, index: int) -> str:
    """The id of call `index`: "call_" + 24 URL-safe base64 characters, from (seed, index)."""
    raw = seed.encode("utf-8") if isinstance(seed, str) else seed
    # The index and a colon come first, so no (seed, index) pair spells another's input.
    digest = hashlib.sha256(f"{index}:".encode("ascii") + raw).digest()
    return CALL_ID_PREFIX + base64.urlsafe_b64encode(digest[:18]).decode("ascii")


def collect(updates: Iterable[StreamUpdate]) -> ParsedOutput:
    """Reassemble stream updates into the output they describe (content, whole calls)."""
    content: list[str] = []
    calls: dict[int, list[CallDelta]] = {}
    for update in updates:
        content.append(update.content)
        for delta in update.calls:
            calls.setdefault(delta.index, []).append(delta)
    return ParsedOutput("".join(content), tuple(_joined(calls[i]) for i in sorted(calls)))


def _joined(deltas: list[CallDelta]) -> ParsedToolCall:
    first = deltas[0]
    return ParsedToolCall(first.id, first.name, "".join(d.arguments for d in deltas))
