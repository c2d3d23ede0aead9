"""Sweeper.stop ends the loop even when a cancellation is swallowed inside a sweep (a billing
process was seen never to finish its shutdown that way)."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry

from llm_billing.keys import KeySpace
from llm_billing.ledger import Ledger
from llm_billing.metrics import BillingMetrics
from llm_billing.server import Billing
from llm_billing.sweeper import Sweeper

pytestmark = pytest.mark.integration


class SwallowingLedger(Ledger):
    """A real ledger whose sweep, like a library that mishandles it, eats one cancellation."""

    sweeps = 0
    swallowed = 0

    async def sweep(self) -> int:
        self.sweeps += 1
        try:
            await asyncio.sleep(0.2)  # a sweep in progress when stop() comes
            return await super().sweep()
        except asyncio.CancelledError:
            self.swallowed += 1
            return 0


async def test_stop_ends_the_loop_despite_a_swallowed_cancellation(billing: Billing) -> None:
    source = billing.ledger
    ledger = SwallowingLedger(
        billing.client, KeySpace("sweeper-test:"), source.prices, source._settings
    )
    sweeper = Sweeper(ledger, interval_s=30.0, metrics=BillingMetrics(CollectorRegistry()))
    sweeper.start()
    await asyncio.sleep(0.05)  # inside the first sweep
    started = time.monotonic()
    # Bounded by the test; without the stop flag it would wait 30 s for the next sweep.
    await asyncio.wait_for(sweeper.stop(), 10)
    assert time.monotonic() - started < 2.0
    assert ledger.swallowed == 1
    assert ledger.sweeps == 1
    await ledger.aclose()


async def test_sweeps_run_each_interval_until_stopped(billing: Billing) -> None:
    source = billing.ledger
    ledger = SwallowingLedger(
        billing.client, KeySpace("sweeper-test:"), source.prices, source._settings
    )
    sweeper = Sweeper(ledger, interval_s=0.05, metrics=BillingMetrics(CollectorRegistry()))
    sweeper.start()
    await asyncio.sleep(1.0)
    async with asyncio.timeout(5):
        await sweeper.stop()
    assert 2 <= ledger.sweeps <= 5  # 0.2 s per sweep plus 0.05 s between them
    await ledger.aclose()
