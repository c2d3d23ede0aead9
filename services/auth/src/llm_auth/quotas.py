"""Limit policy: which buckets a key or tenant has, and what happens when Redis is down."""

from __future__ import annotations

import enum
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import TypeVar

from llm_auth.authenticator import Authenticator
from llm_auth.config import DefaultLimits, FailureMode
from llm_auth.jwt_verify import JWT_KEY_PREFIX
from llm_auth.limiter import BucketSpec, Decision, Lease, Limiter, Refund, RefundStatus
from llm_auth.metrics import AuthMetrics
from llm_auth.principal import KeyLimits
from llm_auth.redis_guard import StoreUnavailable
from llm_common.errors import (
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    QuotaExceeded,
    QuotaViolation,
    Unavailable,
)
from llm_common.logging import get_logger

LIMITS_FRESH_S = 5.0  # a changed key limit reaches every replica's decisions within this
STORE_RETRY_AFTER_S = 1.0
CONCURRENCY_RETRY_AFTER_S = 1.0
T = TypeVar("T")
_log = get_logger(__name__)


class LimitKind(enum.StrEnum):
    REQUESTS = "requests"
    TOKENS = "tokens"
    CONCURRENCY = "concurrency"


def key_bucket(kind: LimitKind, key_id: str, limit: int) -> BucketSpec:
    """The per-minute bucket of one key (`req:key:<id>` or `tok:key:<id>`)."""
    return BucketSpec(f"{_short(kind)}:key:{key_id}", limit)


def tenant_bucket(kind: LimitKind, limit: int) -> BucketSpec:
    """The per-minute bucket of a whole tenant."""
    return BucketSpec(f"{_short(kind)}:tenant", limit)


def _short(kind: LimitKind) -> str:
    return "req" if kind is LimitKind.REQUESTS else "tok"


@dataclass(frozen=True, slots=True)
class TokenGrant:
    """A granted reservation. `enforced` False: granted unchecked (Redis down, fail-open)."""

    remaining: int
    reset_after_s: float
    limit: int  # tokens per minute of the key; 0 = unlimited
    enforced: bool = True


@dataclass(frozen=True, slots=True)
class ConcurrencyGrant:
    in_use: int
    limit: int
    expires_at_ms: int
    enforced: bool = True


class Quotas:
    """Token reservations, concurrency leases and bucket checks for keys and tenants."""

    def __init__(
        self,
        limiter: Limiter,
        authenticator: Authenticator,
        defaults: DefaultLimits,
        failure_mode: FailureMode,
        metrics: AuthMetrics,
        reservation_ttl_s: float,
    ) -> None:
        self._limiter = limiter
        self._auth = authenticator
        self._defaults = defaults
        self._failure_mode = failure_mode
        self._metrics = metrics
        self._reservation_ttl_s = reservation_ttl_s

    async def key_limits(self, tenant_id: str, key_id: str) -> KeyLimits:
        """The key's limits (JWT subjects get the configured defaults); NotFound for an unknown
        key or one of another tenant. StoreUnavailable when Redis is down and not cached."""
        if key_id.startswith(JWT_KEY_PREFIX):
            d = self._defaults
            return KeyLimits(
                d.jwt_requests_per_minute, d.jwt_tokens_per_minute, d.jwt_max_concurrent
            )
        record = await self._auth.record(key_id, max_age_s=LIMITS_FRESH_S)
        if record is None or record.tenant_id != tenant_id:
            raise NotFound("api key", key_id)
        return record.limits

    def tenant_limit(self, kind: LimitKind) -> int:
        d = self._defaults
        if kind is LimitKind.REQUESTS:
            return d.tenant_requests_per_minute
        return d.tenant_tokens_per_minute

    def token_buckets(self, key_id: str, limits: KeyLimits) -> list[BucketSpec]:
        buckets = []
        if limits.tokens_per_minute > 0:
            buckets.append(key_bucket(LimitKind.TOKENS, key_id, limits.tokens_per_minute))
        if self._defaults.tenant_tokens_per_minute > 0:
            buckets.append(tenant_bucket(LimitKind.TOKENS, self._defaults.tenant_tokens_per_minute))
        return buckets

    async def reserve_tokens(
        self, tenant_id: str, key_id: str, tokens: int, reservation_id: str
    ) -> TokenGrant:
        """Charge `tokens` against the key's (and tenant's) tokens per minute, once per id."""
        try:
            limits = await self.key_limits(tenant_id, key_id)
            buckets = self.token_buckets(key_id, limits)
            if not buckets:
                return TokenGrant(remaining=0, reset_after_s=0.0, limit=0)
            reservation = await self._limiter.reserve(
                tenant_id, reservation_id, buckets, tokens, self._reservation_ttl_s
            )
        except StoreUnavailable:
            self._degraded(LimitKind.TOKENS)
            return TokenGrant(remaining=0, reset_after_s=0.0, limit=0, enforced=False)
        decision = reservation.decision
        self._metrics.limit_decision(LimitKind.TOKENS, decision.allowed)
        if not decision.allowed:
            raise _token_quota_error(tenant_id, key_id, tokens, decision)
        # The first bucket's state: the key's own limit, or its tenant's where the key has none
        # (a tenant-only limit must still read as a held reservation, to be refunded).
        state = decision.states[0]
        return TokenGrant(state.remaining, state.reset_after_s, buckets[0].limit)

    async def refund_tokens(
        self, tenant_id: str, key_id: str, reservation_id: str, tokens: int
    ) -> int:
        """Return unused tokens of a reservation; the remaining tokens of the key's bucket."""
        try:
            limits = await self.key_limits(tenant_id, key_id)
            buckets = self.token_buckets(key_id, limits)
            if not buckets:
                return 0
            refund = await self._limiter.refund(tenant_id, reservation_id, buckets, tokens)
        except StoreUnavailable:
            self._degraded(LimitKind.TOKENS)
            return 0
        return _refund_remaining(refund, reservation_id)

    async def acquire(
        self, tenant_id: str, key_id: str, lease_id: str, ttl_s: float
    ) -> ConcurrencyGrant:
        """Take one of the key's concurrent-request slots for `ttl_s` (or renew it)."""
        try:
            limit = (await self.key_limits(tenant_id, key_id)).max_concurrent
            lease = await self._limiter.acquire(tenant_id, key_id, limit, lease_id, ttl_s)
        except StoreUnavailable:
            self._degraded(LimitKind.CONCURRENCY)
            return ConcurrencyGrant(in_use=0, limit=0, expires_at_ms=0, enforced=False)
        self._metrics.limit_decision(LimitKind.CONCURRENCY, lease.acquired)
        if not lease.acquired:
            raise _concurrency_error(tenant_id, key_id, limit, lease)
        return ConcurrencyGrant(lease.in_use, limit, lease.expires_at_ms)

    async def release(self, tenant_id: str, key_id: str, lease_id: str) -> bool:
        """Free a slot; False if it was released already or had expired."""
        try:
            return await self._limiter.release(tenant_id, key_id, lease_id)
        except StoreUnavailable:
            self._degraded(LimitKind.CONCURRENCY)
            return False

    async def hit(
        self, kind: LimitKind, tenant_id: str, bucket: BucketSpec, cost: int
    ) -> Decision | None:
        """Charge one bucket; None when it could not be checked and the policy is fail-open."""
        decision = await self.guarded(kind, self._limiter.hit(tenant_id, [bucket], cost))
        if decision is not None:
            self._metrics.limit_decision(kind, decision.allowed)
        return decision

    async def guarded(self, kind: LimitKind, call: Awaitable[T]) -> T | None:
        """Await `call`; on a Redis outage None (fail-open) or Unavailable (fail-closed)."""
        try:
            return await call
        except StoreUnavailable:
            self._degraded(kind)
            return None

    def _degraded(self, kind: LimitKind) -> None:
        mode = self._failure_mode
        self._metrics.limit_failure(kind, mode.value)
        _log.warning("rate limit store unavailable", kind=kind.value, failure_mode=mode.value)
        if mode is FailureMode.CLOSED:
            raise Unavailable("rate limiter unavailable", retry_after_s=STORE_RETRY_AFTER_S)


def _token_quota_error(tenant_id: str, key_id: str, tokens: int, d: Decision) -> Exception:
    subject = f"tenant:{tenant_id}/key:{key_id}"
    if d.impossible:
        return FailedPrecondition(
            f"{tokens} tokens exceed the tokens-per-minute limit; the request can never fit"
        )
    violation = QuotaViolation(subject, "tokens per minute exhausted")
    return QuotaExceeded([violation], d.retry_after_s, "token rate limit exceeded")


def _concurrency_error(tenant_id: str, key_id: str, limit: int, lease: Lease) -> Exception:
    violation = QuotaViolation(
        f"tenant:{tenant_id}/key:{key_id}", f"all {limit} concurrent request slots are in use"
    )
    # Slots usually free up long before the oldest lease expires: suggest a short wait.
    retry_after_s = min(lease.retry_after_s, CONCURRENCY_RETRY_AFTER_S)
    return QuotaExceeded([violation], retry_after_s, "concurrency limit reached")


def _refund_remaining(refund: Refund, reservation_id: str) -> int:
    if refund.status is RefundStatus.UNKNOWN:
        raise NotFound("reservation", reservation_id)
    if refund.status is RefundStatus.EXCEEDS:
        raise InvalidArgument(
            [FieldViolation("tokens", f"must not exceed the {refund.reserved} reserved tokens")]
        )
    return refund.remaining[0] if refund.remaining else 0
