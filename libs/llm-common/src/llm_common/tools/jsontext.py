"""Strict JSON text helpers shared by tool parsers, forced formats and request checks."""

from __future__ import annotations

import json
from typing import Any, NoReturn


class JsonTextError(ValueError):
    """Text that is not the JSON expected; the message never quotes the text itself."""


def _reject_constant(name: str) -> NoReturn:
    # Python accepts NaN/Infinity, which are not JSON and would not survive compact().
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def loads(text: str) -> Any:
    """Parse standard JSON (no NaN/Infinity); JsonTextError on anything else."""
    try:
        return _DECODER.decode(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: absurdly deep nesting
        raise JsonTextError(f"is not valid JSON: {_reason(exc)}") from exc


def raw_decode(text: str, start: int) -> tuple[Any, int]:
    """One JSON value at text[start:] (no leading whitespace) and the index after it."""
    try:
        return _DECODER.raw_decode(text, start)
    except (ValueError, RecursionError) as exc:
        raise JsonTextError(f"is not valid JSON: {_reason(exc)}") from exc


def load_object(text: str) -> dict[str, Any]:
    """Parse text that must hold one JSON object."""
    value = loads(text)
    if not isinstance(value, dict):
        raise JsonTextError("must be a JSON object")
    return value


def compact(value: Any) -> str:
    """The canonical text of a parsed value: no spaces, non-ASCII kept as is."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, RecursionError):
        return "nested too deeply"
    # JSONDecodeError's msg is positional ("Expecting value"), never the input.
    return getattr(exc, "msg", None) or str(exc)
