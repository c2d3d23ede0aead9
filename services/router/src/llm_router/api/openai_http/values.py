"""Typed reads of request JSON: each wrong value is a 400 naming the parameter."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from llm_router.api.openai_http.errors import invalid

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

Payload = Mapping[str, Any]


def optional(
    payload: Payload, name: str, kind: type | tuple[type, ...], what: str, param: str = ""
) -> Any:
    """payload[name] when it is of `kind`, None when absent or null; `param` names it in errors."""
    value = payload.get(name)
    if value is None:
        return None
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # bool is an int in Python but never a number in JSON Schema.
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        raise invalid(f"{param or name} must be {what}", param or name)
    return value


def number(payload: Payload, name: str, low: float, high: float, param: str = "") -> float | None:
    value = optional(payload, name, (int, float), "a number", param)
    if value is None:
        return None
    if not in_range(value, low, high):
        raise invalid(f"{param or name} must be between {low:g} and {high:g}", param or name)
    return float(value)


def in_range(value: float, low: float, high: float) -> bool:
    """low <= value <= high for a finite value (an int too big for a float included)."""
    if isinstance(value, float) and not math.isfinite(value):
        return False
    return low <= value <= high


def integer(payload: Payload, name: str, low: int, high: int, param: str = "") -> int | None:
    value = optional(payload, name, int, "an integer", param)
    if value is None:
        return None
    if not low <= value <= high:
        raise invalid(f"{param or name} must be between {low} and {high}", param or name)
    return int(value)


def flag(payload: Payload, name: str, param: str = "") -> bool:
    return bool(optional(payload, name, bool, "a boolean", param))


def text(payload: Payload, name: str, param: str = "") -> str:
    """An optional string ("" when absent)."""
    return str(optional(payload, name, str, "a string", param) or "")


def obj(payload: Payload, name: str, param: str = "") -> Payload | None:
    """An optional JSON object."""
    value: Payload | None = optional(payload, name, dict, "an object", param)
    return value


def compact_json(value: Any, param: str) -> str:
    """JSON text without insignificant whitespace; keys keep their order. NaN and Infinity
    (which Python's parser lets through) are no JSON."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise invalid(f"{param} must not contain NaN or Infinity", param) from None
