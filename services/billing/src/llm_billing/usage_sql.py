"""Usage queries on the SQL store: GetUsage and ExportUsage for ranges older than the Redis
record retention (blocking; the service runs them in a thread)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import sqlalchemy as sa

from llm_billing.invoice import HEADER, csv_line
from llm_billing.timeutil import HOUR_MS, rfc3339
from llm_billing.usage import Granularity, UsageBucket, UsageQuery, UsageReport, UsageTotals
from llm_billing.usagedb import UsageStore, datetime_ms, ms_datetime, usage_records
from llmapi.common.v1 import common_pb2

EXPORT_PAGE = 1000
DB_UNAVAILABLE: tuple[type[Exception], ...] = (
    sa.exc.OperationalError,
    sa.exc.InterfaceError,
    sa.exc.TimeoutError,
)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def usage_report(store: UsageStore, q: UsageQuery) -> UsageReport:
    """The same report as UsageReader.usage, from the store's charged rows."""
    if q.granularity is Granularity.DAY:
        day_ms = 24 * HOUR_MS
        start_hour = _ceil_div(q.start_ms, day_ms) * 24
        end_hour = _ceil_div(q.end_ms, day_ms) * 24
    else:
        start_hour, end_hour = _ceil_div(q.start_ms, HOUR_MS), _ceil_div(q.end_ms, HOUR_MS)
    t = usage_records.c
    query = (
        sa.select(
            t.started_hour,
            sa.func.count(),
            sa.func.sum(t.prompt_tokens),
            sa.func.sum(t.completion_tokens),
            sa.func.sum(t.cached_tokens),
            sa.func.sum(t.cost_micros),
        )
        .where(
            t.tenant_id == q.tenant_id,
            t.started_hour >= start_hour,
            t.started_hour < end_hour,
            t.status != "released",
        )
        .group_by(t.started_hour)
    )
    if q.key_id:
        query = query.where(t.key_id == q.key_id)
    if q.model:
        query = query.where(t.model == q.model)
    with store.engine.connect() as conn:
        rows = conn.execute(query).all()
    by_start: dict[int, UsageTotals] = {}
    for hour, *values in rows:
        if q.granularity is Granularity.HOUR:
            start = int(hour) * HOUR_MS
        elif q.granularity is Granularity.DAY:
            start = int(hour) // 24 * 24 * HOUR_MS
        else:
            start = q.start_ms
        totals = UsageTotals(*(int(v or 0) for v in values))
        by_start[start] = by_start.get(start, UsageTotals()) + totals
    buckets = tuple(
        UsageBucket(s, tot) for s, tot in sorted(by_start.items()) if not tot.is_empty()
    )
    return UsageReport(buckets, sum((b.totals for b in buckets), UsageTotals()))


def export_lines(
    store: UsageStore, tenant_id: str | None, start_ms: int, end_ms: int
) -> Iterator[list[str]]:
    """Pages of CSV lines (the header first), as InvoiceExporter.lines writes them: charged
    requests admitted in [start_ms, end_ms), by tenant, then admission time."""
    yield [csv_line(HEADER)]
    t = usage_records.c
    after: tuple[str, datetime, str] | None = None
    while True:
        query = (
            sa.select(usage_records)
            .where(
                t.started_at >= ms_datetime(start_ms),
                t.started_at < ms_datetime(end_ms),
                t.status != "released",
            )
            .order_by(t.tenant_id, t.started_at, t.request_id)
            .limit(EXPORT_PAGE)
        )
        if tenant_id is not None:
            query = query.where(t.tenant_id == tenant_id)
        if after is not None:
            query = query.where(sa.tuple_(t.tenant_id, t.started_at, t.request_id) > after)
        with store.engine.connect() as conn:
            rows = conn.execute(query).mappings().all()
        if not rows:
            return
        yield [csv_line(_cells(row)) for row in rows]
        last = rows[-1]
        after = (last["tenant_id"], last["started_at"], last["request_id"])
        if len(rows) < EXPORT_PAGE:
            return


def _cells(row: sa.RowMapping) -> list[str]:
    return [
        row["request_id"],
        row["tenant_id"],
        row["key_id"],
        row["model"],
        rfc3339(datetime_ms(row["started_at"])),
        rfc3339(datetime_ms(row["settled_at"])),
        row["status"] if row["status"] != "unreserved" else "settled",
        str(row["prompt_tokens"]),
        str(row["completion_tokens"]),
        str(row["cached_tokens"]),
        str(row["cost_micros"]),
        row["currency"],
        _finish_name(int(row["finish_reason"])) if row["status"] != "expired" else "",
    ]


def _finish_name(number: int) -> str:
    if number == 0 or number not in common_pb2.FinishReason.values():
        return ""
    name = common_pb2.FinishReason.Name(number)  # type: ignore[arg-type]
    return name.removeprefix("FINISH_REASON_").lower()
