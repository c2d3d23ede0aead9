"""The usage outbox: Redis streams (one per tenant, in its slot) drained into the SQL store.

The ledger scripts append a request's final usage (settled, corrected, expired, or refunded
after expiry) to `<prefix>{<tenant>}:uout` in the same atomic step as the ledger change, so
the ledger and the outbox never disagree, whatever crashes. The drainer reads the streams in
batches, upserts the rows (idempotent by request id: a newer outcome replaces an older one,
a replay changes nothing) in one transaction, and only then deletes the entries. A crash
between the commit and the delete replays the batch, which changes nothing. While the
database is down the entries wait in Redis (`llm_billing_usage_outbox_backlog`) and the
settle path is unaffected: it never touches the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import redis.asyncio

from llm_billing.keys import KeySpace
from llm_billing.metrics import BillingMetrics
from llm_billing.store import STORE_UNAVAILABLE
from llm_billing.usagedb import UsageRow, UsageStore
from llm_common.logging import get_logger

TENANT_CHUNK = 500
ROUND_BATCHES = 20  # batches per background round before the backlog is published again
MIN_LOCK_TTL_MS = 5_000  # a crashed drainer's lease expires within max(this, 3 intervals)
MAX_BACKOFF_S = 5.0  # retries while the database is down: one connect attempt each
STOP_TIMEOUT_S = 10.0
_STATUS = {"E": "expired", "X": "released"}
# Releases the lock only if this process still holds it.
_UNLOCK = "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end"
_log = get_logger(__name__)


def parse_entry(tenant: str, fields: dict[str, str]) -> UsageRow:
    """The usage row of one outbox entry (see lua/settle.lua, expire.lua, release.lua)."""
    state = fields["st"]
    if state == "S":
        status = "corrected" if fields.get("cr") == "1" else "settled"
    else:
        status = _STATUS[state]
    at = int(fields["at"])
    return UsageRow(
        request_id=fields["r"],
        tenant_id=tenant,
        key_id=fields.get("k", ""),
        model=fields.get("m", ""),
        prompt_tokens=int(fields["pt"]),
        cached_tokens=int(fields["ch"]),
        completion_tokens=int(fields["ct"]),
        cost_micros=int(fields["c"]),
        currency=fields.get("cur", ""),
        price_version=int(fields.get("pf") or 0),
        started_at_ms=at,
        settled_at_ms=int(fields["sa"]),
        started_hour=int(fields["hb"]),
        status=status,
        finish_reason=int(fields.get("fr") or 0),
    )


class StoreNotReadyError(RuntimeError):
    """The database could not be prepared (migrated) yet."""


@dataclass(frozen=True, slots=True)
class Backlog:
    entries: int
    oldest_ms: int | None  # stream id time of the oldest entry


@dataclass(slots=True)
class _Batch:
    rows: list[UsageRow]
    ids: dict[str, list[str]]  # stream key -> entry ids written by this batch


class UsageOutbox:
    """Drains every tenant's outbox stream into the store; one drainer at a time (a Redis
    lock), though concurrent drainers would only repeat idempotent writes."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: KeySpace,
        store: UsageStore,
        metrics: BillingMetrics,
        *,
        batch_size: int = 500,
        interval_s: float = 0.5,
        clock: Callable[[], float] = time.time,
        prepare: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self._client = client
        self._keys = keys
        self._store = store
        self._metrics = metrics
        self._batch_size = batch_size
        self._interval_s = interval_s
        self._clock = clock
        self._prepare = prepare  # e.g. the schema migration: False = not ready, retry later
        self._lock_ttl_ms = max(MIN_LOCK_TTL_MS, round(3 * interval_s * 1000))
        self._token = secrets.token_hex(8)
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._write_lock = asyncio.Lock()

    async def tenants(self) -> list[str]:
        return [t async for t in self._client.sscan_iter(self._keys.tenants(), count=500)]

    async def backlog(self, tenant: str | None = None) -> Backlog:
        """Entries waiting in the outbox (of one tenant, or all) and the oldest one's time."""
        tenants = [tenant] if tenant is not None else await self.tenants()
        entries, oldest = 0, None
        for start in range(0, len(tenants), TENANT_CHUNK):
            async with self._client.pipeline(transaction=False) as pipe:
                for t in tenants[start : start + TENANT_CHUNK]:
                    key = self._keys.usage_outbox(t)
                    pipe.xlen(key)
                    pipe.xrange(key, "-", "+", count=1)
                replies = await pipe.execute()
            for length, first in zip(replies[::2], replies[1::2], strict=True):
                entries += int(length)
                if first:
                    ms = int(str(first[0][0]).split("-", 1)[0])
                    oldest = ms if oldest is None else min(oldest, ms)
        return Backlog(entries, oldest)

    async def drain(
        self, tenant: str | None = None, *, hold_lock: bool = False, max_batches: int = 0
    ) -> int:
        """Write everything waiting (of one tenant, or all; at most `max_batches` batches when
        > 0) to the store; returns the rows written. Database errors propagate (the entries
        stay in the outbox). `hold_lock`: renew the drain lock after each batch."""
        if self._prepare is not None and not await self._prepare():
            raise StoreNotReadyError("usage store schema not ready")
        tenants = [tenant] if tenant is not None else await self.tenants()
        written, batches = 0, 0
        async with self._write_lock:
            while not max_batches or batches < max_batches:
                batches += 1
                batch = await self._read(tenants)
                if not batch.rows:
                    return written
                written += await self._write(batch)
                if hold_lock:
                    await self._lock()
            return written

    async def _read(self, tenants: list[str]) -> _Batch:
        """Up to a batch of entries, from as many tenants as it takes."""
        batch = _Batch([], {})
        for start in range(0, len(tenants), TENANT_CHUNK):
            room = self._batch_size - len(batch.rows)
            if room <= 0:
                break
            chunk = [self._keys.usage_outbox(t) for t in tenants[start : start + TENANT_CHUNK]]
            async with self._client.pipeline(transaction=False) as pipe:
                for key in chunk:
                    pipe.xrange(key, "-", "+", count=room)
                replies = await pipe.execute()
            for tenant, key, entries in zip(
                tenants[start : start + TENANT_CHUNK], chunk, replies, strict=True
            ):
                for entry_id, fields in entries[: max(0, self._batch_size - len(batch.rows))]:
                    batch.rows.append(parse_entry(tenant, fields))
                    batch.ids.setdefault(key, []).append(str(entry_id))
        return batch

    async def _write(self, batch: _Batch) -> int:
        try:
            await asyncio.to_thread(self._store.write, batch.rows)
        except Exception:
            self._metrics.store_errors.labels("write").inc()
            self._metrics.store_up.set(0)
            raise
        self._metrics.store_up.set(1)
        self._metrics.store_rows.inc(len(batch.rows))
        async with self._client.pipeline(transaction=False) as pipe:
            for key, ids in batch.ids.items():
                pipe.xdel(key, *ids)
            await pipe.execute()
        return len(batch.rows)

    # -- the background loop --------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._stopping.clear()
            self._task = asyncio.create_task(self._run(), name="billing-usage-outbox")

    async def stop(self) -> None:
        if self._task is None:
            return
        task, self._task = self._task, None
        self._stopping.set()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=STOP_TIMEOUT_S)
        if not done:
            _log.warning("usage outbox drainer did not stop in time; leaving it")
        with contextlib.suppress(*STORE_UNAVAILABLE):
            await self._client.eval(_UNLOCK, 1, self._keys.outbox_lock(), self._token)

    async def drain_round(self) -> int:
        """One round if this process holds (or takes) the drain lock: drain (at most
        ROUND_BATCHES batches, so the backlog is published under sustained load too), then
        publish the backlog. Redis or database errors propagate."""
        if not await self._lock():
            self._metrics.outbox_backlog.set(0)
            self._metrics.outbox_oldest.set(0)
            return 0
        written = await self.drain(hold_lock=True, max_batches=ROUND_BATCHES)
        backlog = await self.backlog()
        self._metrics.outbox_backlog.set(backlog.entries)
        age = 0.0 if backlog.oldest_ms is None else self._clock() - backlog.oldest_ms / 1000
        self._metrics.outbox_oldest.set(max(0.0, age))
        return written

    async def _lock(self) -> bool:
        key = self._keys.outbox_lock()
        if await self._client.set(key, self._token, nx=True, px=self._lock_ttl_ms):
            return True
        if await self._client.get(key) == self._token:
            await self._client.pexpire(key, self._lock_ttl_ms)
            return True
        return False

    async def _run(self) -> None:
        delay = self._interval_s
        failing = False
        while not self._stopping.is_set():
            try:
                written = await self.drain_round()
                if failing:
                    _log.info("usage store reachable again; draining the outbox")
                failing, delay = False, self._interval_s
                if written >= ROUND_BATCHES * self._batch_size:
                    continue  # more is waiting: the next round at once
            except Exception as exc:
                if not failing:
                    _log.warning("usage outbox drain failed; retrying", error=type(exc).__name__)
                failing = True
                await self._publish_backlog()
                delay = min(MAX_BACKOFF_S, max(self._interval_s, delay * 2))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)

    async def _publish_backlog(self) -> None:
        """While the database is down the backlog still shows (if Redis answers)."""
        try:
            backlog = await self.backlog()
        except Exception:  # Redis down too: the previous value stays
            return
        self._metrics.outbox_backlog.set(backlog.entries)
        if backlog.oldest_ms is not None:
            self._metrics.outbox_oldest.set(max(0.0, self._clock() - backlog.oldest_ms / 1000))
