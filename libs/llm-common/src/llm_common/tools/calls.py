"""Reading one call object out of model output, shared by the parser families."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llm_common.tools.jsontext import JsonTextError, compact, loads
from llm_common.tools.types import CallDelta, call_id

# Hermes/Qwen write "arguments", Llama 3.1 writes "parameters"; either is accepted from both.
ARGUMENT_KEYS = ("arguments", "parameters")


@dataclass(frozen=True, slots=True)
class FoundCall:
    name: str
    arguments: str  # compact JSON object text


def call_from_object(value: Any) -> FoundCall | None:
    """{"name": str, "arguments" | "parameters": object or its JSON text}; None otherwise.

    Missing arguments mean none ({}); other keys are ignored.
    """
    if not isinstance(value, dict):
        return None
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments: Any = next((value[key] for key in ARGUMENT_KEYS if key in value), {})
    if isinstance(arguments, str):  # some models double-encode the arguments
        try:
            arguments = loads(arguments)
        except JsonTextError:
            return None
    if not isinstance(arguments, dict):
        return None
    return FoundCall(name, compact(arguments))


def call_from_text(text: str) -> FoundCall | None:
    """A call object written as JSON text (surrounding whitespace allowed)."""
    try:
        return call_from_object(loads(text))
    except JsonTextError:
        return None


class CallNumbering:
    """Numbers a stream's calls and gives each its deterministic id."""

    def __init__(self, seed: bytes | str) -> None:
        self._seed = seed
        self._next = 0

    def delta(self, call: FoundCall) -> CallDelta:
        """The call as one fragment: id, name and all of its arguments."""
        index = self._next
        self._next += 1
        return CallDelta(index, call_id(self._seed, index), call.name, call.arguments)
