"""Budgets per tenant and per key: limits (admin) and the balance of the current period."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import redis.asyncio

from llm_billing.keys import KeySpace
from llm_billing.store import now_ms
from llm_billing.timeutil import Period, period_end_ms, period_id
from llm_common.errors import NotFound

MAX_LIMIT_MICROS = 10**15  # keeps every balance check exact in the Lua scripts


@dataclass(frozen=True, slots=True)
class BudgetLimits:
    """A scope's limits; 0 means none. `key_id` empty: the tenant-wide budget."""

    tenant_id: str
    key_id: str
    period: Period
    hard_limit_micros: int
    soft_limit_micros: int


@dataclass(frozen=True, slots=True)
class BudgetStatus:
    """Limits plus the current period's balance."""

    limits: BudgetLimits
    spent_micros: int
    reserved_micros: int
    resets_at_ms: int | None
    currency: str


class Budgets:
    """Budget limits and balances in the ledger (balances are kept by the ledger scripts for
    every period at once, so a new or changed budget sees the spend so far)."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: KeySpace,
        currency: str,
        *,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._client = client
        self._keys = keys
        self._currency = currency
        self._clock = clock

    async def get(self, tenant_id: str, key_id: str) -> BudgetStatus:
        """The budget of a scope; NotFound when none was set."""
        period, hard, soft = await self._client.hmget(
            self._keys.budget(tenant_id, key_id), ["period", "hard", "soft"]
        )
        if period is None:
            raise NotFound("budget", _name(tenant_id, key_id))
        limits = BudgetLimits(
            tenant_id, key_id, Period(str(period)), int(hard or 0), int(soft or 0)
        )
        return await self._status(limits)

    async def set(self, limits: BudgetLimits) -> BudgetStatus:
        """Create or replace a scope's limits; the balance is kept."""
        await self._client.hset(
            self._keys.budget(limits.tenant_id, limits.key_id),
            mapping={
                "period": limits.period.value,
                "hard": limits.hard_limit_micros,
                "soft": limits.soft_limit_micros,
            },
        )
        return await self._status(limits)

    async def _status(self, limits: BudgetLimits) -> BudgetStatus:
        now = self._clock()
        balance = self._keys.balance(limits.tenant_id, limits.key_id, period_id(limits.period, now))
        spent, reserved = await self._client.hmget(balance, ["sp", "rs"])
        return BudgetStatus(
            limits=limits,
            spent_micros=int(spent or 0),
            reserved_micros=int(reserved or 0),
            resets_at_ms=period_end_ms(limits.period, now),
            currency=self._currency,
        )


def _name(tenant_id: str, key_id: str) -> str:
    return f"tenant:{tenant_id}" if not key_id else f"tenant:{tenant_id}/key:{key_id}"
