"""Key administration rules over the KeyStore: tenant reach, revocation, rotation grace."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from llm_auth.admin import AdminGate
from llm_auth.apikeys import ParsedKey
from llm_auth.authenticator import now_ms
from llm_auth.keystore import KeyPage, KeyStore, NewKey
from llm_auth.principal import Principal
from llm_auth.records import KeyRecord
from llm_auth.redis_guard import StoreUnavailable
from llm_common.errors import FailedPrecondition, NotFound, Unavailable

STORE_RETRY_AFTER_S = 1.0
T = TypeVar("T")


class KeyAdmin:
    """Create, list, revoke and rotate keys on behalf of an authenticated admin."""

    def __init__(
        self, store: KeyStore, gate: AdminGate, clock_ms: Callable[[], int] = now_ms
    ) -> None:
        self._store = store
        self._gate = gate
        self._clock_ms = clock_ms

    async def create(self, admin: Principal, spec: NewKey) -> tuple[KeyRecord, ParsedKey]:
        self._gate.check_tenant(admin, spec.tenant_id)
        return await _available(self._store.create(spec, self._clock_ms()))

    async def list(
        self, admin: Principal, tenant_id: str, offset: int, page_size: int, include_revoked: bool
    ) -> KeyPage:
        self._gate.check_tenant(admin, tenant_id)
        return await _available(
            self._store.list(
                tenant_id, offset=offset, page_size=page_size, include_revoked=include_revoked
            )
        )

    async def revoke(self, admin: Principal, key_id: str) -> KeyRecord:
        await self._managed(admin, key_id)
        record = await _available(self._store.revoke(key_id, self._clock_ms()))
        if record is None:
            raise NotFound("api key", key_id)
        return record

    async def rotate(
        self, admin: Principal, key_id: str, grace_s: float
    ) -> tuple[KeyRecord, ParsedKey]:
        record = await self._managed(admin, key_id)
        now = self._clock_ms()
        if record.is_revoked() or record.is_expired(now):
            raise FailedPrecondition("a revoked or expired key cannot be rotated")
        rotated = await _available(
            self._store.rotate(key_id, grace_ms=round(grace_s * 1000), now_ms=now)
        )
        if rotated is None:
            raise NotFound("api key", key_id)
        return rotated

    async def forget_tenant(self, admin: Principal, tenant_id: str) -> int:
        """Delete the tenant's keys and rate-limit state; returns the keys deleted."""
        self._gate.check_erasure(admin, tenant_id)
        return await _available(self._store.forget_tenant(tenant_id))

    async def _managed(self, admin: Principal, key_id: str) -> KeyRecord:
        record = await _available(self._store.get(key_id))
        if record is None:
            raise NotFound("api key", key_id)
        self._gate.check_key(admin, record.tenant_id, key_id)
        return record


async def _available(call: Awaitable[T]) -> T:
    try:
        return await call
    except StoreUnavailable:
        raise Unavailable("key store unavailable", retry_after_s=STORE_RETRY_AFTER_S) from None
