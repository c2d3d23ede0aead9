"""The Violations collector and field checks."""

from __future__ import annotations

import pytest

from llm_common.errors import FieldViolation, InvalidArgument
from llm_common.validation import Violations, check_range, check_repeated, check_text


def test_collects_every_violation_then_raises_once() -> None:
    v = Violations()
    assert v.require(True, "model", "required")
    assert not v.require(False, "model", "required")
    v.add("max_tokens", "must be > 0")
    assert len(v) == 2
    with pytest.raises(InvalidArgument) as info:
        v.raise_if_any()
    assert info.value.violations == (
        FieldViolation("model", "required"),
        FieldViolation("max_tokens", "must be > 0"),
    )


def test_no_violations_does_not_raise() -> None:
    v = Violations()
    v.raise_if_any()
    assert not v


def test_check_text_counts_utf8_bytes() -> None:
    v = Violations()
    assert check_text(v, "a", "héllo", max_bytes=6)  # é is two bytes
    assert not check_text(v, "b", "héllo!", max_bytes=6)
    assert not check_text(v, "c", "", max_bytes=6)
    assert check_text(v, "d", "", max_bytes=6, allow_empty=True)
    assert not check_text(v, "e", "bad \ud800 surrogate", max_bytes=100)
    assert [(x.field, x.description) for x in v.items] == [
        ("b", "must be at most 6 bytes (UTF-8)"),
        ("c", "must not be empty"),
        ("e", "must be valid UTF-8"),
    ]


def test_check_repeated() -> None:
    v = Violations()
    assert check_repeated(v, "stop", ["a", "b"], max_items=4)
    assert not check_repeated(v, "stop", ["a"] * 5, max_items=4)
    assert not check_repeated(v, "messages", [], max_items=4, min_items=1)
    assert [x.field for x in v.items] == ["stop", "messages"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf"), -0.1, 2.01])
def test_check_range_rejects(value: float) -> None:
    v = Violations()
    assert not check_range(v, "temperature", value, min_value=0.0, max_value=2.0)
    assert v.items[0].field == "temperature"


@pytest.mark.parametrize("value", [0.0, 1.0, 2.0])
def test_check_range_accepts_inclusive_bounds(value: float) -> None:
    assert check_range(Violations(), "temperature", value, min_value=0.0, max_value=2.0)
