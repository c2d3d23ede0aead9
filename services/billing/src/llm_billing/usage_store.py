"""The usage store's parts wired together (engine, outbox drainer, invoices, reconciliation)
and its background jobs: schema migration, outbox drain and periodic reconciliation."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import redis.asyncio

from llm_billing import usage_sql
from llm_billing.config import LedgerSettings, UsageStoreSettings
from llm_billing.invoicing import Invoicing
from llm_billing.keys import KeySpace
from llm_billing.metrics import BillingMetrics
from llm_billing.reconcile import Reconciler
from llm_billing.timeutil import HOUR_MS
from llm_billing.usage import UsageQuery, UsageReport
from llm_billing.usage_outbox import UsageOutbox
from llm_billing.usagedb import UsageStore, make_engine, upgrade
from llm_common.errors import Unavailable
from llm_common.logging import get_logger

STOP_TIMEOUT_S = 10.0
_log = get_logger(__name__)


@contextlib.asynccontextmanager
async def database_errors() -> AsyncIterator[None]:
    """A database outage is UNAVAILABLE with RetryInfo (the queries are read-only or
    idempotent)."""
    try:
        yield
    except usage_sql.DB_UNAVAILABLE as exc:
        _log.warning("usage store unavailable", error=type(exc).__name__)
        raise Unavailable("billing usage store unavailable", retry_after_s=2.0) from exc


@dataclass(slots=True)
class UsageStoreParts:
    """Everything of the store one billing process uses."""

    settings: UsageStoreSettings
    store: UsageStore
    outbox: UsageOutbox
    invoicing: Invoicing
    reconciler: Reconciler
    retention_ms: int
    clock: Callable[[], int]
    metrics: BillingMetrics
    _migrated: bool = False
    _reconcile_task: asyncio.Task[None] | None = None

    def reads_store(self, start_ms: int) -> bool:
        """Ranges starting before the Redis record retention are read from the store."""
        return start_ms < self.clock() - self.retention_ms

    async def usage(self, query: UsageQuery) -> UsageReport:
        async with database_errors():
            return await asyncio.to_thread(usage_sql.usage_report, self.store, query)

    async def export(self, tenant_id: str | None, start_ms: int, end_ms: int) -> AsyncIterator[str]:
        pages = usage_sql.export_lines(self.store, tenant_id, start_ms, end_ms)
        while True:
            async with database_errors():
                page = await asyncio.to_thread(next, pages, None)
            if page is None:
                return
            for line in page:
                yield line

    async def migrate(self) -> bool:
        """Run the migrations once (a no-op when current); False while the database is down."""
        if self._migrated or not self.settings.migrate:
            self._migrated = True
            return True
        try:
            await asyncio.to_thread(upgrade, self.store.engine)
        except Exception as exc:
            self.metrics.store_errors.labels("migrate").inc()
            _log.warning("usage store migration failed; retrying", error=type(exc).__name__)
            return False
        self._migrated = True
        database = self.store.engine.url.render_as_string(hide_password=True)
        _log.info("usage store schema current", database=database)
        return True

    def start(self) -> None:
        self.outbox.start()
        if self.settings.reconcile_interval_s > 0 and self._reconcile_task is None:
            self._reconcile_task = asyncio.create_task(self._reconcile_loop(), name="reconcile")

    async def stop(self) -> None:
        await self.outbox.stop()
        task, self._reconcile_task = self._reconcile_task, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=STOP_TIMEOUT_S)
        self.store.dispose()

    async def _reconcile_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reconcile_interval_s)
            end_hour = self.clock() // HOUR_MS + 1
            try:
                await self.reconciler.run(end_hour - self.settings.reconcile_window_hours, end_hour)
            except Exception as exc:
                _log.warning("reconciliation failed", error=type(exc).__name__)


def build_usage_store(
    settings: UsageStoreSettings,
    ledger: LedgerSettings,
    client: redis.asyncio.Redis,
    keys: KeySpace,
    currency: str,
    metrics: BillingMetrics,
    clock: Callable[[], int],
) -> UsageStoreParts:
    """The parts over one engine (nothing connects until first use)."""
    store = UsageStore(make_engine(settings))
    parts: UsageStoreParts
    outbox = UsageOutbox(
        client,
        keys,
        store,
        metrics,
        batch_size=settings.batch_size,
        interval_s=settings.drain_interval_s,
        prepare=lambda: parts.migrate(),
    )
    settle_window = ledger.reservation_ttl_ms + round(2 * ledger.sweep_interval_s * 1000)
    invoicing = Invoicing(store, outbox, currency, settle_window, clock)
    reconciler = Reconciler(client, keys, store, outbox, metrics)
    parts = UsageStoreParts(
        settings, store, outbox, invoicing, reconciler, ledger.retention_ms, clock, metrics
    )
    return parts
