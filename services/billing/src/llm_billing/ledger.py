"""Two-phase metering on the Redis ledger: Reserve, Settle, Release and reservation expiry.

Every state change is one Lua script in the tenant's slot, so it is atomic, and every one
is idempotent by request id: a record moves R (reserved) -> S (settled) | X (released) |
E (expired, charged at the reserved amount); E -> S corrects the charge, E -> X refunds it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import redis.asyncio

from llm_billing.config import LedgerSettings
from llm_billing.keys import KeySpace
from llm_billing.ledger_values import (
    Admission,
    BatchOp,
    BatchOutcome,
    ReleaseInput,
    Reservation,
    ReserveInput,
    SettleInput,
    Settlement,
)
from llm_billing.prices import Price, PriceBook
from llm_billing.scripts import Scripts
from llm_billing.store import STORE_UNAVAILABLE, now_ms
from llm_billing.timeutil import Period, day_id, hour_id, month_id, period_end_ms
from llm_common.errors import (
    AlreadyExists,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    QuotaExceeded,
    QuotaViolation,
    ServiceError,
    Unavailable,
)
from llm_common.redis_mux import Command, Pipelined, ReplicaWait, execute_scripts, pipelined

SWEEP_BATCH = 500
# A tenant is re-added to the tenants set at most this often by one process (the SADD is
# idempotent; repeating it now and then restores the set if Redis lost it).
TENANT_REGISTER_INTERVAL_S = 60.0
MAX_REGISTERED_TENANTS = 100_000
MAX_CLOCK_SKEW_MS = 5 * 60_000  # how far in the future an `admitted_at` may lie


class TenantRegister:
    """Which tenants this process has put in the tenants set lately, so that the hot path
    sends SADD once per tenant and interval instead of on every Reserve."""

    def __init__(
        self,
        interval_s: float = TENANT_REGISTER_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval_s = interval_s
        self._clock = clock
        self._next: dict[str, float] = {}

    def due(self, tenant: str) -> bool:
        return self._clock() >= self._next.get(tenant, 0.0)

    def registered(self, tenant: str) -> None:
        if len(self._next) >= MAX_REGISTERED_TENANTS:
            self._next.clear()  # bounded memory; the cost is one SADD per tenant again
        self._next[tenant] = self._clock() + self._interval_s


class Ledger:
    """Reserve/Settle/Release/expiry against one Redis; `clock` returns epoch ms; `hot`
    carries Reserve and Settle (default: RedisMux on the client's endpoint)."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        keys: KeySpace,
        prices: PriceBook,
        settings: LedgerSettings,
        *,
        clock: Callable[[], int] = now_ms,
        hot: Pipelined | None = None,
        outbox: bool = False,
        wait: ReplicaWait | None = None,
    ) -> None:
        self._client = client
        # Reserve and Settle are acknowledged only once `wait.replicas` replicas have them
        # (WAIT after the scripts, one per burst on the shared connection): a failover then
        # cannot lose a charge the caller was told about. None: no wait (one node).
        self._wait = wait
        # With the usage store on, the scripts append each final usage to the tenant's
        # outbox stream in the same atomic step as the ledger change (see outbox.py).
        self._outbox = outbox
        self._keys = keys
        self._prices = prices
        self._settings = settings
        self._clock = clock
        self._scripts = Scripts.register(client)
        self._tenants = TenantRegister()
        # Reserve and Settle: one round trip and little CPU (see mux.py).
        self._hot = hot if hot is not None else pipelined(client)

    async def aclose(self) -> None:
        """Close the hot-path connection (the redis-py client is closed by its owner)."""
        await self._hot.aclose()

    @property
    def prices(self) -> PriceBook:
        return self._prices

    async def reserve(self, r: ReserveInput) -> Reservation:
        """Hold the worst-case cost; QuotaExceeded over a hard limit.

        One round trip: the script and the claim of the request id travel in one pipeline.
        A request id already owned by another tenant is refused and the reservation the
        script may have made is undone."""
        now = self._clock()
        price = self._price(r.model, now)
        keys = self._record_keys(r.tenant_id, r.request_id)
        args = [
            self._keys.tenant_base(r.tenant_id),
            r.request_id,
            r.key_id,
            r.model,
            r.prompt_tokens,
            r.max_completion_tokens,
            *_price_args(price),
            now,
            now + self._settings.reservation_ttl_ms,
            *_time_args(now),
            self._settings.retention_ms,
        ]
        reply, owner = await self._reserve_and_claim(r, keys, args)
        if owner != r.tenant_id:
            if reply[0] == "ok":
                await self._scripts.forget(keys=keys, args=[args[0], r.request_id, now])
            raise AlreadyExists("request", r.request_id, "request_id is used by another request")
        return self._reservation(r, reply, now)

    async def _reserve_and_claim(
        self, r: ReserveInput, keys: list[str], args: list[str | int]
    ) -> tuple[list[str], str | None]:
        owner_key = self._keys.request_owner(r.request_id)
        register = self._tenants.due(r.tenant_id)
        commands: list[Command] = [
            ["EVALSHA", self._scripts.reserve.sha, len(keys), *keys, *args],
            ["SET", owner_key, r.tenant_id, "NX", "PX", self._settings.retention_ms],
            ["GET", owner_key],
        ]
        if register:
            commands.append(["SADD", self._keys.tenants(), r.tenant_id])
        reply, _, owner, *_ = _raise_first(await self._run(commands, wait=self._wait))
        if register:
            self._tenants.registered(r.tenant_id)
        return reply, None if owner is None else str(owner)

    async def _run(self, commands: list[Command], wait: ReplicaWait | None = None) -> list[Any]:
        """The commands in one round trip; every command here is idempotent, so they are
        sent again after a lost connection or NOSCRIPT (see execute_scripts). With `wait`,
        acknowledged once that many replicas have them (else ReplicaWaitError: retryable)."""
        return await execute_scripts(
            self._hot,
            commands,
            lambda: self._scripts.load(self._client),
            idempotent=True,
            wait=wait,
        )

    async def settle(self, s: SettleInput) -> Settlement:
        """Record actual usage; without a reservation it needs `s.admission` (else NotFound)."""
        tenant = s.tenant_id or await self._owner(s.request_id)
        reply = None
        if tenant is not None:
            reply = await self._settle(tenant, s, ())
        if reply is None or reply[0] == "missing":
            return await self._settle_unreserved(s)
        return _settlement(s.request_id, reply)

    async def _settle_unreserved(self, s: SettleInput) -> Settlement:
        """Record usage that has no reservation (admitted while billing was unreachable)."""
        if s.admission is None or not s.tenant_id:
            raise NotFound("reservation", s.request_id)
        extra = self._admission_args(s.admission)
        await self._claim(s.request_id, s.tenant_id)
        return _settlement(s.request_id, await self._settle(s.tenant_id, s, extra))

    async def release(self, request_id: str, tenant_id: str = "") -> bool:
        """Cancel an open reservation (or refund an expired charge); False if nothing to do."""
        tenant = tenant_id or await self._owner(request_id)
        if tenant is None:
            return False
        released = await self._scripts.release(
            keys=self._release_keys(tenant, request_id),
            args=[self._keys.tenant_base(tenant), request_id, self._clock()],
        )
        return bool(int(released))

    async def apply_many(self, ops: Sequence[BatchOp]) -> list[BatchOutcome]:
        """Settle and release many requests, in order, each as `settle`/`release` would.

        One round trip when every op names its tenant and has a reservation: all scripts go
        out in one pipeline. Ops without a tenant cost one more round trip (all owner lookups
        together); settles without a reservation (the router skips Reserve where no budget
        applies) are then recorded as `settle` does, concurrently, so their commands share
        the auto-pipelined connection. A store failure of the pipeline is raised (the batch
        may be retried as a whole: every op is idempotent); in the second step it is the op's
        Unavailable."""
        tenants = await self._owners(ops)
        commands: list[Command] = []
        for op, tenant in zip(ops, tenants, strict=True):
            if tenant is not None:
                commands.append(self._batch_command(op, tenant))
        replies = iter(await self._run(commands, wait=self._wait) if commands else [])
        pending = [
            self._batch_outcome(op, None if tenant is None else next(replies))
            for op, tenant in zip(ops, tenants, strict=True)
        ]
        return list(await asyncio.gather(*pending))

    async def _owners(self, ops: Sequence[BatchOp]) -> list[str | None]:
        """Each op's tenant: as given, else the request id's owner (one round trip)."""
        lookups = [op.request_id for op in ops if not op.tenant_id]
        found: dict[str, str | None] = {}
        if lookups:
            commands: list[Command] = [["GET", self._keys.request_owner(r)] for r in lookups]
            owners = _raise_first(await self._run(commands))
            found = {r: None if o is None else str(o) for r, o in zip(lookups, owners, strict=True)}
        return [op.tenant_id or found[op.request_id] for op in ops]

    def _batch_command(self, op: BatchOp, tenant: str) -> Command:
        base = self._keys.tenant_base(tenant)
        if isinstance(op, ReleaseInput):
            sha, rkeys = self._scripts.release.sha, self._release_keys(tenant, op.request_id)
            return ["EVALSHA", sha, len(rkeys), *rkeys, base, op.request_id, self._clock()]
        keys = self._settle_keys(tenant, op.request_id)
        return ["EVALSHA", self._scripts.settle.sha, len(keys), *keys, *self._settle_args(op, base)]

    async def _batch_outcome(self, op: BatchOp, reply: Any) -> BatchOutcome:
        if isinstance(reply, Exception):
            return reply
        if isinstance(op, ReleaseInput):
            return reply is not None and bool(int(reply))
        if reply is not None and reply[0] != "missing":
            return _settlement(op.request_id, reply)
        try:
            return await self._settle_unreserved(op)
        except ServiceError as err:
            return err
        except STORE_UNAVAILABLE:
            return Unavailable("billing ledger unavailable", retry_after_s=1.0)

    async def expire_due(self, tenant_id: str, batch: int = SWEEP_BATCH) -> int:
        """Charge up to `batch` of the tenant's expired reservations; returns how many."""
        now = self._clock()
        keys = [self._keys.open_reservations(tenant_id), self._keys.records_by_time(tenant_id)]
        if self._outbox:
            keys.append(self._keys.usage_outbox(tenant_id))
        count = await self._scripts.expire(
            keys=keys,
            args=[
                self._keys.tenant_base(tenant_id),
                now,
                batch,
                now - self._settings.retention_ms,
            ],
        )
        return int(count)

    async def sweep(self) -> int:
        """Charge every tenant's expired reservations; returns how many."""
        total = 0
        async for tenant in self._client.sscan_iter(self._keys.tenants(), count=500):
            while True:
                expired = await self.expire_due(tenant)
                total += expired
                if expired < SWEEP_BATCH:
                    break
        return total

    def _price(self, model: str, at_ms: int) -> Price:
        price = self._prices.at(model, at_ms)
        if price is None:
            raise NotFound("price", model, f"model {model!r} has no price")
        return price

    def _record_keys(self, tenant: str, request_id: str) -> list[str]:
        return [
            self._keys.record(tenant, request_id),
            self._keys.open_reservations(tenant),
            self._keys.records_by_time(tenant),
        ]

    def _settle_keys(self, tenant: str, request_id: str) -> list[str]:
        keys = self._record_keys(tenant, request_id)
        return [*keys, self._keys.usage_outbox(tenant)] if self._outbox else keys

    def _release_keys(self, tenant: str, request_id: str) -> list[str]:
        keys = self._record_keys(tenant, request_id)[:2]
        return [*keys, self._keys.usage_outbox(tenant)] if self._outbox else keys

    async def _claim(self, request_id: str, tenant: str) -> None:
        """Bind the request id to the tenant (first writer wins) and register the tenant."""
        owner_key = self._keys.request_owner(request_id)
        # SET NX then GET, not SET NX GET: that form needs Redis 7, and the embedded Redis
        # that `make up` falls back to is 6.2. On the shared auto-pipelined connection, so
        # the claims of a batch's unreserved settles travel together.
        commands: list[Command] = [
            ["SET", owner_key, tenant, "NX", "PX", self._settings.retention_ms],
            ["GET", owner_key],
            ["SADD", self._keys.tenants(), tenant],
        ]
        _, owner, _ = _raise_first(await self._run(commands))
        if owner is not None and str(owner) != tenant:
            raise AlreadyExists("request", request_id, "request_id is used by another request")

    async def _owner(self, request_id: str) -> str | None:
        (owner,) = _raise_first(await self._run([["GET", self._keys.request_owner(request_id)]]))
        return None if owner is None else str(owner)

    async def _settle(self, tenant: str, s: SettleInput, extra: Sequence[str | int]) -> list[str]:
        keys = self._settle_keys(tenant, s.request_id)
        args = [*self._settle_args(s, self._keys.tenant_base(tenant)), *extra]
        command = ["EVALSHA", self._scripts.settle.sha, len(keys), *keys, *args]
        (reply,) = _raise_first(await self._run([command], wait=self._wait))
        return cast(list[str], reply)

    def _settle_args(self, s: SettleInput, base: str) -> list[str | int]:
        u = s.usage
        return [
            base,
            s.request_id,
            u.prompt_tokens,
            u.completion_tokens,
            u.cached_tokens,
            u.finish_reason,
            self._clock(),
        ]

    def _admission_args(self, a: Admission) -> list[str | int]:
        now = self._clock()
        at = now if a.admitted_at_ms is None else a.admitted_at_ms
        if at > now + MAX_CLOCK_SKEW_MS:
            raise InvalidArgument([FieldViolation("admitted_at", "must not be in the future")])
        if at < now - self._settings.retention_ms:
            # The record of such a request may already be gone, so a duplicate could not be
            # recognised: refuse rather than risk counting it twice.
            raise FailedPrecondition("admitted_at is older than the billing record retention")
        price = self._price(a.model, at)
        return [
            a.key_id,
            a.model,
            *_price_args(price),
            at,
            *_time_args(at),
            self._settings.retention_ms,
        ]

    def _reservation(self, r: ReserveInput, reply: list[str], now: int) -> Reservation:
        kind = reply[0]
        if kind == "ok":
            return Reservation(
                request_id=r.request_id,
                reserved_micros=int(reply[1]),
                currency=self._prices.currency,
                soft_limit_exceeded=reply[2] == "1",
                expires_at_ms=now + self._settings.reservation_ttl_ms,
                duplicate=False,
                budgeted=reply[3] == "1",
            )
        if kind == "dup":
            if reply[1] != "1":
                raise AlreadyExists(
                    "request", r.request_id, "request_id was reserved with other arguments"
                )
            return Reservation(
                request_id=r.request_id,
                reserved_micros=int(reply[2]),
                currency=reply[3],
                soft_limit_exceeded=reply[4] == "1",
                expires_at_ms=int(reply[5]),
                duplicate=True,
            )
        raise self._over_budget(r, reply, now)

    def _over_budget(self, r: ReserveInput, reply: list[str], now: int) -> QuotaExceeded:
        _, scope, period_name, hard, used, amount = reply
        period = Period(period_name)
        subject = f"tenant:{r.tenant_id}" if scope == "t" else f"key:{r.key_id}"
        per = "in total" if period is Period.TOTAL else f"per {period.value}"
        description = (
            f"hard budget of {hard} micros {per} would be exceeded: {used} used or held, "
            f"this request needs up to {amount}"
        )
        end = period_end_ms(period, now)
        retry = None if end is None else (end - now) / 1000
        return QuotaExceeded(
            [QuotaViolation(subject, description)], retry_after_s=retry, message="budget exceeded"
        )


def _raise_first(replies: list[Any]) -> list[Any]:
    """The replies, unless one is an error reply: then that error."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


def _price_args(price: Price) -> list[str | int]:
    return [
        price.input_micros_per_mtok,
        price.output_micros_per_mtok,
        price.cached_input_micros_per_mtok,
        price.effective_from_ms,
        price.currency,
    ]


def _time_args(at_ms: int) -> list[str | int]:
    return [hour_id(at_ms), day_id(at_ms), month_id(at_ms)]


def _settlement(request_id: str, reply: list[str]) -> Settlement:
    if reply[0] == "dup":
        return Settlement(request_id, int(reply[1]), reply[2], True, reply[3] == "1", False)
    return Settlement(
        request_id=request_id,
        charged_micros=int(reply[1]),
        currency=reply[2],
        duplicate=False,
        corrected=reply[3] == "1",
        unreserved=reply[4] == "1",
    )
