"""Fixtures of the ledger suites (test_ledger.py, test_ledger_budgets.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import redis.asyncio

from llm_billing.config import Settings
from llm_billing.prices import PriceBook
from llm_billing.server import Billing

from .ledger_helpers import Clock, wired_billing


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture(params=["mux", "pool"])
async def billing_at(
    request: pytest.FixtureRequest,
    settings: Settings,
    prices: PriceBook,
    clock: Clock,
    redis_client: redis.asyncio.Redis,
) -> AsyncIterator[Billing]:
    """The wired service on a fake clock, over RedisMux and over redis-py's pool."""
    async with wired_billing(request.param, settings, prices, clock) as built:
        yield built
