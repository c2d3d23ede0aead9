"""UTC periods and buckets."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from llm_billing.timeutil import (
    Period,
    day_id,
    hour_id,
    month_id,
    period_end_ms,
    period_id,
    rfc3339,
)


def ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp()) * 1000  # type: ignore[misc]


def test_bucket_ids() -> None:
    t = ms(2026, 3, 4, 5, 6, 7)
    assert hour_id(t) * 3_600_000 == ms(2026, 3, 4, 5)
    assert day_id(t) * 86_400_000 == ms(2026, 3, 4)
    assert month_id(t) == "202603"
    assert period_id(Period.DAY, t) == f"d{day_id(t)}"
    assert period_id(Period.MONTH, t) == "m202603"
    assert period_id(Period.TOTAL, t) == "all"


@pytest.mark.parametrize(
    ("at", "period", "end"),
    [
        (ms(2026, 3, 4, 5), Period.DAY, ms(2026, 3, 5)),
        (ms(2026, 3, 4, 23, 59, 59) + 999, Period.DAY, ms(2026, 3, 5)),
        (ms(2026, 2, 28, 12), Period.MONTH, ms(2026, 3, 1)),
        (ms(2026, 12, 31, 23), Period.MONTH, ms(2027, 1, 1)),
        (ms(2026, 1, 1), Period.MONTH, ms(2026, 2, 1)),
    ],
)
def test_period_end(at: int, period: Period, end: int) -> None:
    assert period_end_ms(period, at) == end


def test_total_never_resets() -> None:
    assert period_end_ms(Period.TOTAL, ms(2026, 1, 1)) is None


def test_rfc3339_keeps_milliseconds() -> None:
    assert rfc3339(ms(2026, 1, 2, 3, 4, 5) + 7) == "2026-01-02T03:04:05.007Z"
