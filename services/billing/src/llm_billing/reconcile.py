"""Reconciliation: the Redis ledger's hourly counters against the SQL usage store.

For every tenant x key x model x UTC hour of a range, the ledger's counters (requests,
prompt, completion and cached tokens, cost) must equal the sums of the store's charged rows
(released rows charge nothing). The outbox is drained first; a cell that differs is checked
again after one more drain, so a settle that lands between the two reads is not reported.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass

import redis.asyncio
import sqlalchemy as sa

from llm_billing.keys import KeySpace
from llm_billing.metrics import BillingMetrics
from llm_billing.usage import UsageTotals
from llm_billing.usage_outbox import UsageOutbox
from llm_billing.usagedb import UsageStore, usage_records
from llm_common.logging import get_logger

PIPELINE_CHUNK = 500
_log = get_logger(__name__)


@dataclass(frozen=True, slots=True, order=True)
class Cell:
    tenant_id: str
    key_id: str
    model: str
    hour: int  # UTC hours since the epoch


@dataclass(frozen=True, slots=True)
class Difference:
    cell: Cell
    ledger: UsageTotals
    store: UsageTotals


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    start_hour: int
    end_hour: int  # exclusive
    cells: int  # cells with usage on either side
    differences: tuple[Difference, ...]
    backlog: int  # outbox entries still waiting after the drain

    @property
    def clean(self) -> bool:
        return not self.differences


def ledger_cells(tenant: str, hour: int, counters: dict[str, str]) -> dict[Cell, UsageTotals]:
    """Per key x model cells of one tenant's hour hash (`<metric>|<dimension>` fields).
    Usage without a key is the model's total less its keyed usage."""
    keyed: dict[tuple[str, str], list[int]] = {}
    by_model: dict[str, list[int]] = {}
    metrics = ("n", "pt", "ct", "ch", "c")
    for name, value in counters.items():
        metric, _, rest = name.partition("|")
        if metric not in metrics:
            continue
        dim, _, tail = rest.partition("|")
        i = metrics.index(metric)
        if dim == "km":
            key, _, model = tail.partition("|")
            keyed.setdefault((key, model), [0] * 5)[i] += int(value)
        elif dim == "m":
            by_model.setdefault(tail, [0] * 5)[i] += int(value)
    cells: dict[Cell, UsageTotals] = {}
    for (key, model), values in keyed.items():
        cells[Cell(tenant, key, model, hour)] = UsageTotals(*values)
        rest_of_model = by_model.setdefault(model, [0] * 5)
        for i, v in enumerate(values):
            rest_of_model[i] -= v
    for model, values in by_model.items():
        cells[Cell(tenant, "", model, hour)] = UsageTotals(*values)
    return {cell: t for cell, t in cells.items() if not t.is_empty()}


def store_cells(
    store: UsageStore, start_hour: int, end_hour: int, tenant: str | None
) -> dict[Cell, UsageTotals]:
    """The store's sums per cell (blocking)."""
    t = usage_records.c
    query = (
        sa.select(
            t.tenant_id,
            t.key_id,
            t.model,
            t.started_hour,
            sa.func.count(),
            sa.func.sum(t.prompt_tokens),
            sa.func.sum(t.completion_tokens),
            sa.func.sum(t.cached_tokens),
            sa.func.sum(t.cost_micros),
        )
        .where(t.started_hour >= start_hour, t.started_hour < end_hour, t.status != "released")
        .group_by(t.tenant_id, t.key_id, t.model, t.started_hour)
    )
    if tenant is not None:
        query = query.where(t.tenant_id == tenant)
    with store.engine.connect() as conn:
        rows = conn.execute(query).all()
    return {
        Cell(r[0], r[1], r[2], int(r[3])): UsageTotals(*(int(v or 0) for v in r[4:])) for r in rows
    }


def compare(ledger: dict[Cell, UsageTotals], store: dict[Cell, UsageTotals]) -> list[Difference]:
    empty = UsageTotals()
    return [
        Difference(cell, ledger.get(cell, empty), store.get(cell, empty))
        for cell in sorted(set(ledger) | set(store))
        if ledger.get(cell, empty) != store.get(cell, empty)
    ]


class Reconciler:
    """Compares the two sides over a range of hours."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: KeySpace,
        store: UsageStore,
        outbox: UsageOutbox,
        metrics: BillingMetrics,
    ) -> None:
        self._client = client
        self._keys = keys
        self._store = store
        self._outbox = outbox
        self._metrics = metrics

    async def run(
        self, start_hour: int, end_hour: int, tenant: str | None = None
    ) -> ReconcileReport:
        """Drain, compare, and confirm any difference after one more drain. Errors propagate
        (and are counted as a failed run)."""
        try:
            report = await self._run(start_hour, end_hour, tenant)
        except Exception:
            self._metrics.reconcile_runs.labels("failed").inc()
            raise
        self._metrics.reconcile_differences.set(len(report.differences))
        self._metrics.reconcile_runs.labels("clean" if report.clean else "differences").inc()
        if not report.clean:
            _log.warning(
                "reconciliation found differences",
                differences=len(report.differences),
                start_hour=start_hour,
                end_hour=end_hour,
            )
        return report

    async def _run(self, start_hour: int, end_hour: int, tenant: str | None) -> ReconcileReport:
        first, cells = await self._pass(start_hour, end_hour, tenant)
        differences = first
        if first:
            second, cells = await self._pass(start_hour, end_hour, tenant)
            persisting = {d.cell for d in first}
            differences = [d for d in second if d.cell in persisting]
        backlog = await self._outbox.backlog(tenant)
        return ReconcileReport(start_hour, end_hour, cells, tuple(differences), backlog.entries)

    async def _pass(
        self, start_hour: int, end_hour: int, tenant: str | None
    ) -> tuple[list[Difference], int]:
        await self._outbox.drain(tenant)
        tenants = [tenant] if tenant is not None else await self._outbox.tenants()
        ledger = await self._ledger(tenants, range(start_hour, end_hour))
        store = await asyncio.to_thread(store_cells, self._store, start_hour, end_hour, tenant)
        return compare(ledger, store), len(set(ledger) | set(store))

    async def _ledger(self, tenants: Iterable[str], hours: range) -> dict[Cell, UsageTotals]:
        reads = [(t, h) for t in tenants for h in hours]
        cells: dict[Cell, UsageTotals] = {}
        for start in range(0, len(reads), PIPELINE_CHUNK):
            chunk = reads[start : start + PIPELINE_CHUNK]
            async with self._client.pipeline(transaction=False) as pipe:
                for t, h in chunk:
                    pipe.hgetall(self._keys.usage_hour(t, h))
                replies = await pipe.execute()
            for (t, h), counters in zip(chunk, replies, strict=True):
                if counters:
                    cells.update(ledger_cells(t, h, counters))
        return cells


def format_report(report: ReconcileReport) -> list[str]:
    """Human-readable lines: a summary, then one line per difference."""
    lines = [
        f"hours {report.start_hour}..{report.end_hour - 1}: {report.cells} cells, "
        f"{len(report.differences)} differences, outbox backlog {report.backlog}"
    ]
    for d in report.differences:
        c = d.cell
        lines.append(
            f"DIFF tenant={c.tenant_id} key={c.key_id or '-'} model={c.model} hour={c.hour} "
            f"ledger={_totals(d.ledger)} store={_totals(d.store)}"
        )
    return lines


def _totals(t: UsageTotals) -> str:
    return (
        f"(n={t.requests} pt={t.prompt_tokens} ct={t.completion_tokens} "
        f"ch={t.cached_tokens} c={t.cost_micros})"
    )
