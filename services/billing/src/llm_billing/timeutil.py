"""UTC calendar arithmetic on epoch milliseconds: hours, days, months and budget periods."""

from __future__ import annotations

import enum
import functools
from datetime import UTC, datetime

HOUR_MS = 3_600_000
DAY_MS = 86_400_000


class Period(enum.StrEnum):
    """A budget period, as stored in Redis."""

    DAY = "day"
    MONTH = "month"
    TOTAL = "total"


def hour_id(ms: int) -> int:
    """Hours since the epoch: the usage bucket of an instant."""
    return ms // HOUR_MS


def day_id(ms: int) -> int:
    """Days since the epoch (UTC)."""
    return ms // DAY_MS


def month_id(ms: int) -> str:
    """`YYYYMM` of the UTC month holding `ms`."""
    return _month_of_day(ms // DAY_MS)


@functools.lru_cache(maxsize=64)
def _month_of_day(day: int) -> str:
    # Cached: Reserve needs it on every call, and a day has one month.
    return datetime.fromtimestamp(day * DAY_MS / 1000, UTC).strftime("%Y%m")


def period_id(period: Period, ms: int) -> str:
    """The balance suffix of the period holding `ms` (as the Lua scripts build it)."""
    if period is Period.DAY:
        return f"d{day_id(ms)}"
    if period is Period.MONTH:
        return f"m{month_id(ms)}"
    return "all"


def period_end_ms(period: Period, ms: int) -> int | None:
    """Start of the period after the one holding `ms`; None for TOTAL (never resets)."""
    if period is Period.DAY:
        return (day_id(ms) + 1) * DAY_MS
    if period is Period.MONTH:
        moment = datetime.fromtimestamp(ms / 1000, UTC)
        year, month = divmod(moment.year * 12 + moment.month, 12)  # the next month, 0-based
        return int(datetime(year, month + 1, 1, tzinfo=UTC).timestamp()) * 1000
    return None


def to_datetime(ms: int) -> datetime:
    """Aware UTC datetime of epoch milliseconds."""
    return datetime.fromtimestamp(ms / 1000, UTC)


def rfc3339(ms: int) -> str:
    """`2026-01-02T03:04:05.678Z`."""
    return to_datetime(ms).strftime("%Y-%m-%dT%H:%M:%S.") + f"{ms % 1000:03d}Z"
