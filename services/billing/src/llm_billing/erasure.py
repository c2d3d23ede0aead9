"""Tenant erasure (`llmctl tenants forget`, docs/adr/0017): a tenant's per-request records
go, what invoices and usage reports sum stays.

- Redis ledger: every request record (`rec:<id>`), its owner key (`rid:<id>`) and the
  record index (`recs`) are deleted. Hourly and daily counters, budgets and balances (sums,
  no request) are kept.
- SQL usage store: invoices count rows, so a row cannot simply go while its month is not
  invoiced. Each row loses what ties it to one request: its request id becomes a random
  `erased-` id, its start and settle times are cut to the hour, its finish reason is dropped.
  Counts, tokens and costs per hour, key and model (what invoices and reconciliation read)
  are unchanged.

Refused (FAILED_PRECONDITION) while the tenant has open reservations or usage not yet in the
store: those would write request records again after the erasure.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass

import redis.asyncio
import sqlalchemy as sa

from llm_billing.keys import KeySpace
from llm_billing.usagedb import UsageStore, ms_datetime, usage_records
from llm_common.errors import FailedPrecondition, PreconditionViolation

ERASED_PREFIX = "erased-"
_BATCH = 500
_HOUR_MS = 3_600_000


@dataclass(frozen=True, slots=True)
class Erased:
    ledger_records: int
    usage_rows: int


class TenantEraser:
    """Erases one tenant's per-request records from the ledger and the usage store."""

    def __init__(
        self, client: redis.asyncio.Redis, keys: KeySpace, store: UsageStore | None
    ) -> None:
        self._client = client
        self._keys = keys
        self._store = store

    async def forget(self, tenant: str) -> Erased:
        await self._check_settled(tenant)
        records = await self._forget_ledger(tenant)
        rows = 0
        if self._store is not None:
            rows = await asyncio.to_thread(scrub_usage_rows, self._store, tenant)
        return Erased(records, rows)

    async def _check_settled(self, tenant: str) -> None:
        open_count = await self._client.zcard(self._keys.open_reservations(tenant))
        pending = await self._client.xlen(self._keys.usage_outbox(tenant))
        violations = []
        if open_count:
            violations.append(
                PreconditionViolation(
                    "OPEN_RESERVATIONS", f"tenant:{tenant}", f"{open_count} requests still open"
                )
            )
        if pending and self._store is not None:
            violations.append(
                PreconditionViolation(
                    "USAGE_NOT_STORED", f"tenant:{tenant}", f"{pending} usage events undelivered"
                )
            )
        if violations:
            raise FailedPrecondition(
                "the tenant has requests in flight; erase again once they are settled "
                "(its keys are gone, so none start)",
                violations,
            )

    async def _forget_ledger(self, tenant: str) -> int:
        index = self._keys.records_by_time(tenant)
        deleted = 0
        while ids := await self._client.zrange(index, 0, _BATCH - 1):
            names = [i.decode() if isinstance(i, bytes) else str(i) for i in ids]
            async with self._client.pipeline(transaction=False) as pipe:
                for request_id in names:
                    pipe.delete(self._keys.record(tenant, request_id))
                pipe.zrem(index, *names)
                replies = await pipe.execute()
            deleted += sum(int(r) for r in replies[:-1])
            await self._forget_owners(tenant, names)
        await self._client.delete(index)
        return deleted

    async def _forget_owners(self, tenant: str, request_ids: list[str]) -> None:
        """`rid:<id>` keys (outside the tenant's slot) that name this tenant."""
        owners = [self._keys.request_owner(i) for i in request_ids]
        for name in owners:  # one by one: on a cluster each may live on another node
            owner = await self._client.get(name)
            if isinstance(owner, bytes):
                owner = owner.decode()
            if owner == tenant:
                await self._client.delete(name)


def scrub_usage_rows(store: UsageStore, tenant: str) -> int:
    """Blocking: give the tenant's rows random ids and hour-cut times; returns rows changed."""
    t = usage_records
    changed = 0
    with store.engine.begin() as conn:
        while True:
            rows = conn.execute(
                sa.select(t.c.request_id, t.c.started_hour)
                .where(t.c.tenant_id == tenant, ~t.c.request_id.startswith(ERASED_PREFIX))
                .limit(_BATCH)
            ).all()
            if not rows:
                return changed
            for request_id, hour in rows:
                moment = ms_datetime(int(hour) * _HOUR_MS)
                conn.execute(
                    sa.update(t)
                    .where(t.c.request_id == request_id)
                    .values(
                        request_id=f"{ERASED_PREFIX}{secrets.token_hex(16)}",
                        started_at=moment,
                        settled_at=moment,
                        finish_reason=0,
                    )
                )
            changed += len(rows)
