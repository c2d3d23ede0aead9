"""Decisions for Envoy's rate-limit service: which bucket a descriptor means, and its verdict.

Recognised entries: `tenant`, `key_id` and `unit` (`requests`, default, or `tokens`).
A descriptor with Envoy's `limit` override gets its own bucket with that limit; otherwise
`key_id` selects the key's per-minute limit and `tenant` alone the tenant default. Other
descriptors have no limit here and are answered OK.
"""

from __future__ import annotations

from dataclasses import dataclass

from llm_auth.descriptors import Descriptor
from llm_auth.limiter import BucketSpec
from llm_auth.quotas import LimitKind, Quotas, key_bucket, tenant_bucket
from llm_common.errors import NotFound, Unavailable

GLOBAL_TENANT = "_global"  # hash tag of override buckets that name no tenant
CLOSED_RETRY_AFTER_S = 1.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """One descriptor's answer. `limit` 0: no limit applies (nothing to report)."""

    allowed: bool
    limit: int = 0
    period_s: float = 60.0
    remaining: int = 0
    reset_after_s: float = 0.0
    retry_after_s: float = 0.0


@dataclass(frozen=True, slots=True)
class _Target:
    tenant_id: str
    bucket: BucketSpec
    kind: LimitKind


class RateLimitPolicy:
    """Maps descriptors to buckets and charges them through Quotas."""

    def __init__(self, quotas: Quotas) -> None:
        self._quotas = quotas

    async def decide(self, domain: str, descriptor: Descriptor) -> Verdict:
        """The verdict for one descriptor; fail-closed outages are over-limit verdicts."""
        try:
            target = await self._target(domain, descriptor)
            if target is None:
                return Verdict(allowed=True)
            decision = await self._quotas.hit(
                target.kind, target.tenant_id, target.bucket, descriptor.hits
            )
        except NotFound:  # descriptor names a key that does not exist: nothing to enforce
            return Verdict(allowed=True)
        except Unavailable:  # store down and the policy is fail-closed
            return Verdict(allowed=False, retry_after_s=CLOSED_RETRY_AFTER_S)
        if decision is None:  # fail-open
            return Verdict(allowed=True)
        state = decision.states[0]
        return Verdict(
            allowed=decision.allowed,
            limit=target.bucket.limit,
            period_s=target.bucket.period_s,
            remaining=state.remaining,
            reset_after_s=state.reset_after_s,
            retry_after_s=decision.retry_after_s,
        )

    async def _target(self, domain: str, d: Descriptor) -> _Target | None:
        kind = LimitKind.TOKENS if d.get("unit") == "tokens" else LimitKind.REQUESTS
        tenant, key_id = d.get("tenant"), d.get("key_id")
        if d.override is not None:
            bucket = BucketSpec(f"d:{d.fingerprint(domain)}", d.override.limit, d.override.period_s)
            return _Target(tenant or GLOBAL_TENANT, bucket, kind)
        if key_id is not None and tenant is not None:
            return await self._key_target(kind, tenant, key_id)
        if tenant is not None:
            limit = self._quotas.tenant_limit(kind)
            return _Target(tenant, tenant_bucket(kind, limit), kind) if limit > 0 else None
        return None

    async def _key_target(self, kind: LimitKind, tenant: str, key_id: str) -> _Target | None:
        limits = await self._quotas.guarded(kind, self._quotas.key_limits(tenant, key_id))
        if limits is None:
            return None  # key store down, fail-open
        if kind is LimitKind.REQUESTS:
            limit = limits.requests_per_minute
        else:
            limit = limits.tokens_per_minute
        return _Target(tenant, key_bucket(kind, key_id, limit), kind) if limit > 0 else None
