"""The bootstrap admin key: an operator-supplied key stored (as a digest) on first start."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from llm_auth.apikeys import parse_key
from llm_auth.keystore import KeyStore, with_digest_of
from llm_auth.principal import ADMIN_SCOPE
from llm_auth.records import KeyRecord
from llm_auth.redis_guard import StoreUnavailable
from llm_common.logging import get_logger
from llm_common.resilience import Backoff

BOOTSTRAP_KEY_NAME = "bootstrap-admin"
_BACKOFF = Backoff(base=0.5, cap=30.0, jitter=0.5)
_log = get_logger(__name__)


async def ensure_admin_key(
    store: KeyStore, pepper: bytes, key_text: str, admin_tenant: str, now_ms: int
) -> bool:
    """Store the bootstrap key unless its key id already exists (then it is left alone, so a
    rotated or revoked bootstrap key stays that way). True when it was created now."""
    key = parse_key(key_text)
    template = KeyRecord(
        key_id=key.key_id,
        tenant_id=admin_tenant,
        digest="",
        name=BOOTSTRAP_KEY_NAME,
        scopes=(ADMIN_SCOPE,),
        created_at_ms=now_ms,
    )
    created = await store.insert(with_digest_of(template, pepper, key))
    _log.info("bootstrap admin key", key_id=key.key_id, created=created)
    return created


async def ensure_admin_key_with_retry(
    store: KeyStore, pepper: bytes, key_text: str, admin_tenant: str, clock_ms: Callable[[], int]
) -> None:
    """ensure_admin_key, retried with jittered backoff while Redis is unreachable (the
    service keeps serving JWTs and cached keys meanwhile)."""
    for attempt, delay in enumerate(_BACKOFF, start=1):
        try:
            await ensure_admin_key(store, pepper, key_text, admin_tenant, clock_ms())
            return
        except StoreUnavailable:
            _log.warning("bootstrap admin key deferred: redis unavailable", attempt=attempt)
            await asyncio.sleep(delay)
