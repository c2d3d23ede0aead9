"""Exact distributed limits in Redis: token buckets, token reservations, concurrency leases."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llm_auth import lua
from llm_auth.keyspace import Keyspace
from llm_auth.redis_guard import RedisGuard
from llm_common.redis_mux import eval_script, pipelined

MINUTE_S = 60.0
_US = 1_000_000


@dataclass(frozen=True, slots=True)
class BucketSpec:
    """A token bucket of one tenant: `limit` units per `period_s`, refilled continuously.

    A full bucket admits a burst of `limit`; that is what makes "100 per minute" exact:
    at most `limit` units in any period plus what refilled meanwhile.
    """

    name: str  # e.g. `req:key:<id>`; the tenant hash tag is added by the limiter
    limit: int
    period_s: float = MINUTE_S

    def __post_init__(self) -> None:
        if self.limit < 1 or self.period_s <= 0:
            raise ValueError("a bucket needs limit >= 1 and period_s > 0")


@dataclass(frozen=True, slots=True)
class BucketState:
    """A bucket after the decision: whole units left and time until it is full again."""

    remaining: int
    reset_after_s: float


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome for all buckets of one call (all charged, or none)."""

    allowed: bool
    retry_after_s: float  # 0 when allowed
    states: tuple[BucketState, ...]
    impossible: bool = False  # the cost exceeds a bucket's limit: waiting will not help


@dataclass(frozen=True, slots=True)
class Reservation:
    """A token reservation; `duplicate` when the id had already reserved (nothing charged)."""

    decision: Decision
    duplicate: bool


class RefundStatus(enum.Enum):
    REFUNDED = 1
    ALREADY_REFUNDED = 0  # the first refund of this reservation id stands
    UNKNOWN = -1  # no such reservation, or it expired
    EXCEEDS = -2  # more than was reserved


@dataclass(frozen=True, slots=True)
class Refund:
    status: RefundStatus
    remaining: tuple[int, ...] = ()
    reserved: int = 0


@dataclass(frozen=True, slots=True)
class Lease:
    """A concurrency slot decision."""

    acquired: bool
    in_use: int
    retry_after_s: float  # when the oldest lease expires, if not acquired
    expires_at_ms: int


class Limiter:
    """Runs the Lua scripts; Redis outages surface as StoreUnavailable from the guard."""

    def __init__(self, guard: RedisGuard, keyspace: Keyspace) -> None:
        self._guard = guard
        self._keys = keyspace
        client = guard.client
        # Every edge request charges a bucket or two: one shared, auto-pipelined connection
        # costs a fraction of redis-py's per-call CPU (see llm_common.redis_mux).
        self._hot = pipelined(client)
        self._hit = client.register_script(lua.HIT)
        self._reserve = client.register_script(lua.RESERVE)
        self._refund = client.register_script(lua.REFUND)
        self._acquire = client.register_script(lua.ACQUIRE)
        self._release = client.register_script(lua.RELEASE)

    async def hit(self, tenant_id: str, buckets: Sequence[BucketSpec], cost: int) -> Decision:
        """Charge `cost` units to every bucket, or to none; cost 0 only checks."""
        keys = [self._keys.bucket(tenant_id, b.name) for b in buckets]
        reply = await self._run(self._hit, keys, [cost, *_bucket_args(buckets)])
        return _decision(reply)

    async def reserve(
        self,
        tenant_id: str,
        reservation_id: str,
        buckets: Sequence[BucketSpec],
        tokens: int,
        ttl_s: float,
    ) -> Reservation:
        """Charge `tokens` once per reservation id and remember the amount for a refund."""
        keys = [self._keys.reservation(tenant_id, reservation_id)]
        keys += [self._keys.bucket(tenant_id, b.name) for b in buckets]
        args = [tokens, int(ttl_s * 1000), *_bucket_args(buckets)]
        reply = await self._run(self._reserve, keys, args)
        return Reservation(decision=_decision(reply[1:]), duplicate=bool(reply[0]))

    async def refund(
        self, tenant_id: str, reservation_id: str, buckets: Sequence[BucketSpec], tokens: int
    ) -> Refund:
        """Give back up to the reserved amount, once per reservation id."""
        keys = [self._keys.reservation(tenant_id, reservation_id)]
        keys += [self._keys.bucket(tenant_id, b.name) for b in buckets]
        reply = await self._run(self._refund, keys, [tokens, *_bucket_args(buckets)])
        status = RefundStatus(int(reply[0]))
        if status is RefundStatus.EXCEEDS:
            return Refund(status, reserved=int(reply[1]))
        return Refund(status, remaining=tuple(int(x) for x in reply[1:]))

    async def acquire(
        self, tenant_id: str, key_id: str, limit: int, lease_id: str, ttl_s: float
    ) -> Lease:
        """Take (or renew) a slot; `limit` 0 tracks leases without a cap."""
        keys = [self._keys.leases(tenant_id, key_id)]
        reply = await self._run(self._acquire, keys, [limit, lease_id, int(ttl_s * 1000)])
        acquired, in_use, retry_ms, expires = (int(x) for x in reply)
        return Lease(bool(acquired), in_use, max(retry_ms, 0) / 1000, expires)

    async def release(self, tenant_id: str, key_id: str, lease_id: str) -> bool:
        """Free a slot; False when it had been released already or had expired."""
        keys = [self._keys.leases(tenant_id, key_id)]
        return bool(await self._run(self._release, keys, [lease_id]))

    async def aclose(self) -> None:
        await self._hot.aclose()

    async def _run(self, script: Any, keys: list[str], args: list[Any]) -> list[Any]:
        reply: list[Any] = await self._guard.run(self._eval, script, keys, args)
        return reply

    async def _eval(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        """One script, never resent after a lost connection: a bucket charge is not
        idempotent (it may have been applied before the connection broke)."""

        async def load() -> None:
            script.sha = await self._guard.client.script_load(script.script)

        return await eval_script(self._hot, script.sha, keys, args, load)


def _bucket_args(buckets: Sequence[BucketSpec]) -> list[int]:
    args: list[int] = []
    for bucket in buckets:
        args += [bucket.limit, round(bucket.period_s * _US)]
    return args


def _decision(reply: Sequence[Any]) -> Decision:
    allowed, impossible, retry_us, *rest = (int(x) for x in reply)
    states = tuple(
        BucketState(remaining=rest[i], reset_after_s=rest[i + 1] / _US)
        for i in range(0, len(rest), 2)
    )
    return Decision(
        allowed=bool(allowed),
        retry_after_s=retry_us / _US,
        states=states,
        impossible=bool(impossible),
    )
