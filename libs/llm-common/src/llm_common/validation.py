"""Request validation that collects every violation and raises one InvalidArgument."""

from __future__ import annotations

import math
from collections.abc import Sized

from llm_common.errors import FieldViolation, InvalidArgument


class Violations:
    """Collects field violations; `raise_if_any()` reports them all at once."""

    def __init__(self) -> None:
        self._items: list[FieldViolation] = []

    def add(self, field: str, description: str) -> None:
        """Record that `field` is invalid."""
        self._items.append(FieldViolation(field, description))

    def require(self, condition: bool, field: str, description: str) -> bool:
        """Record a violation unless `condition` holds; returns `condition`."""
        if not condition:
            self.add(field, description)
        return condition

    @property
    def items(self) -> tuple[FieldViolation, ...]:
        return tuple(self._items)

    def __bool__(self) -> bool:
        return bool(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def raise_if_any(self, message: str = "invalid request") -> None:
        """Raise InvalidArgument listing every recorded violation, if there are any."""
        if self._items:
            raise InvalidArgument(self.items, message)


def utf8_length(value: str) -> int | None:
    """The UTF-8 byte length of `value`, or None if it cannot be encoded (lone surrogates)."""
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return None


def check_text(
    v: Violations, field: str, value: str, max_bytes: int, *, allow_empty: bool = False
) -> bool:
    """Validate a string: valid UTF-8, non-empty unless allowed, at most `max_bytes` bytes."""
    size = utf8_length(value)
    if size is None:
        v.add(field, "must be valid UTF-8")
        return False
    if size == 0 and not allow_empty:
        v.add(field, "must not be empty")
        return False
    return v.require(size <= max_bytes, field, f"must be at most {max_bytes} bytes (UTF-8)")


def check_repeated(
    v: Violations, field: str, items: Sized, *, max_items: int, min_items: int = 0
) -> bool:
    """Validate the length of a repeated field."""
    count = len(items)
    if count < min_items:
        v.add(field, f"must have at least {min_items} item(s)")
        return False
    return v.require(count <= max_items, field, f"must have at most {max_items} items")


def check_range(
    v: Violations,
    field: str,
    value: float,
    *,
    min_value: float | None = None,
    max_value: float | None = None,
) -> bool:
    """Validate a finite number within inclusive bounds (NaN and infinities are rejected)."""
    if not math.isfinite(value):
        v.add(field, "must be a finite number")
        return False
    if min_value is not None and value < min_value:
        v.add(field, f"must be >= {min_value}")
        return False
    return v.require(max_value is None or value <= max_value, field, f"must be <= {max_value}")
