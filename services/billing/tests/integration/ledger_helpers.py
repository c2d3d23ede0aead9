"""Helpers shared by the ledger tests (test_ledger, test_ledger_budgets): a controlled clock,
the wired service on it, request builders and ledger read-outs."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import redis.asyncio

from llm_billing.config import Settings
from llm_billing.keys import KeySpace
from llm_billing.ledger import Ledger
from llm_billing.ledger_values import Admission, ReserveInput, SettleInput, Usage
from llm_billing.prices import PriceBook
from llm_billing.server import Billing, build_billing
from llm_billing.timeutil import DAY_MS
from llm_billing.usage import Granularity, UsageQuery, UsageTotals
from llm_common.redis_mux import PoolPipeline

T0 = int(datetime(2026, 3, 10, 22, 30, tzinfo=UTC).timestamp()) * 1000
STOP = 1
TTL_MS = 600_000


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@contextlib.asynccontextmanager
async def wired_billing(
    transport: str, settings: Settings, prices: PriceBook, clock: Clock
) -> AsyncIterator[Billing]:
    """The wired service on a fake clock; Reserve/Settle over RedisMux ("mux") or, as with
    TLS, over redis-py's pool ("pool")."""
    built = build_billing(settings, prices, clock=clock)
    if transport == "pool":
        keys = KeySpace(settings.ledger.key_prefix)
        hot = PoolPipeline(built.client)
        ledger = Ledger(built.client, keys, prices, settings.ledger, clock=clock, hot=hot)
        built = dataclasses.replace(built, ledger=ledger)
    try:
        yield built
    finally:
        await built.aclose()


def reserve(rid: str, tenant: str = "acme", key: str = "k1", model: str = "small",
            prompt: int = 1000, max_completion: int = 500) -> ReserveInput:  # fmt: skip
    return ReserveInput(rid, tenant, key, model, prompt, max_completion)


def settle(rid: str, prompt: int = 1000, completion: int = 200, cached: int = 0,
           tenant: str = "", admission: Admission | None = None) -> SettleInput:  # fmt: skip
    return SettleInput(rid, tenant, Usage(prompt, completion, cached, STOP), admission)


async def dump(client: redis.asyncio.Redis, prefix: str) -> dict[str, Any]:
    """Every key under the prefix with its value (the whole ledger state)."""
    state: dict[str, Any] = {}
    async for key in client.scan_iter(match=f"{prefix}*"):
        kind = await client.type(key)
        if kind == "hash":
            state[key] = await client.hgetall(key)
        elif kind == "zset":
            state[key] = await client.zrange(key, 0, -1, withscores=True)
        elif kind == "set":
            state[key] = sorted(await client.smembers(key))
        else:
            state[key] = await client.get(key)
    return state


async def totals(b: Billing, tenant: str = "acme", key: str = "", model: str = "") -> UsageTotals:
    report = await b.usage.usage(
        UsageQuery(tenant, key, model, T0 - 40 * DAY_MS, T0 + 40 * DAY_MS, Granularity.TOTAL)
    )
    return report.total
