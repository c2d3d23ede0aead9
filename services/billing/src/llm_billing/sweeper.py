"""Background task that charges expired reservations at their reserved amount."""

from __future__ import annotations

import asyncio
import contextlib

from llm_billing.ledger import Ledger
from llm_billing.metrics import BillingMetrics
from llm_billing.store import STORE_UNAVAILABLE
from llm_common.logging import get_logger

STOP_TIMEOUT_S = 5.0  # beyond one interval: a sweep in progress is bounded by Redis timeouts
_log = get_logger(__name__)


class Sweeper:
    """Runs `Ledger.sweep` every `interval_s`; safe on every replica at once (each expiry is
    one idempotent script)."""

    def __init__(self, ledger: Ledger, interval_s: float, metrics: BillingMetrics) -> None:
        self._ledger = ledger
        self._interval_s = interval_s
        self._metrics = metrics
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def start(self) -> None:
        if self._task is None:
            self._stopping.clear()
            self._task = asyncio.create_task(self._run(), name="billing-sweeper")

    async def stop(self) -> None:
        """End the loop. Besides the cancellation, a flag: a cancellation swallowed inside a
        Redis call (it has been seen: a server then never finished its shutdown) would
        otherwise leave the loop running and this await waiting for ever."""
        if self._task is None:
            return
        task, self._task = self._task, None
        self._stopping.set()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=self._interval_s + STOP_TIMEOUT_S)
        if not done:
            _log.warning("sweeper did not stop in time; leaving it")
        elif not task.cancelled() and task.exception() is not None:
            _log.warning("sweeper ended with an error", error=type(task.exception()).__name__)

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
        while not self._stopping.is_set():
            await self.sweep_once()
            with contextlib.suppress(TimeoutError):  # the interval, or until stop()
                await asyncio.wait_for(self._stopping.wait(), self._interval_s)
