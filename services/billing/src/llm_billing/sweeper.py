"""Background task that charges expired reservations at their reserved amount."""

from __future__ import annotations

import asyncio
import contextlib

from llm_billing.ledger import Ledger
from llm_billing.metrics import BillingMetrics
from llm_billing.store import STORE_UNAVAILABLE
from llm_common.logging import get_logger

_log = get_logger(__name__)


class Sweeper:
    """Runs `Ledger.sweep` every `interval_s`; safe on every replica at once (each expiry is
    one idempotent script)."""

    def __init__(self, ledger: Ledger, interval_s: float, metrics: BillingMetrics) -> None:
        self._ledger = ledger
        self._interval_s = interval_s
        self._metrics = metrics
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="billing-sweeper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def sweep_once(self) -> int:
        """One pass; a Redis outage is logged and retried on the next pass."""
        try:
            expired = await self._ledger.sweep()
        except STORE_UNAVAILABLE as exc:
            _log.warning("sweep skipped: ledger store unavailable", error=type(exc).__name__)
            return 0
        except Exception:
            _log.exception("sweep failed")
            return 0
        if expired:
            self._metrics.expired.inc(expired)
            _log.info("expired reservations charged", count=expired)
        return expired

    async def _run(self) -> None:
        while True:
            await self.sweep_once()
            await asyncio.sleep(self._interval_s)
