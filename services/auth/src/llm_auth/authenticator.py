"""Credential -> Principal: API keys against Redis (with an outage cache) and JWTs."""

from __future__ import annotations

import time
from collections.abc import Callable

from llm_auth.apikeys import MalformedKeyError, ParsedKey, looks_like_key, parse_key
from llm_auth.jwt_verify import JwtVerifier, looks_like_jwt
from llm_auth.keystore import KeyStore
from llm_auth.metrics import AuthMetrics
from llm_auth.principal import CredentialType, Principal
from llm_auth.records import KeyRecord
from llm_auth.redis_guard import StoreUnavailable
from llm_auth.ttl_cache import TtlCache
from llm_common.errors import ServiceError, Unauthenticated, Unavailable

MAX_CREDENTIAL_CHARS = 8192
STORE_RETRY_AFTER_S = 1.0


def now_ms() -> int:
    """Wall-clock Unix milliseconds (key expiry is absolute time)."""
    return time.time_ns() // 1_000_000


class Authenticator:
    """Verifies credentials. Redis is the source of truth for API keys.

    A key verified less than `fresh_s` ago is checked against its cached record without a
    Redis round trip (the secret is still compared every time). Revocations and rotations
    evict it at once on every replica (key events); if a replica missed an announcement, it
    is stale for at most `fresh_s`. While Redis is unreachable, keys verified within the
    cache TTL keep working: a revocation made during an outage takes effect once Redis is
    back or the entry's TTL has passed.
    """

    def __init__(
        self,
        keys: KeyStore,
        pepper: bytes,
        cache: TtlCache[str, KeyRecord],
        metrics: AuthMetrics,
        jwt: JwtVerifier | None = None,
        clock_ms: Callable[[], int] = now_ms,
        fresh_s: float = 0.0,
    ) -> None:
        self._keys = keys
        self._pepper = pepper
        self._cache = cache
        self._metrics = metrics
        self._jwt = jwt
        self._clock_ms = clock_ms
        self._fresh_s = fresh_s

    async def authenticate(self, credential: str) -> Principal:
        """The principal behind an `sk-…` key or a JWT; Unauthenticated, or Unavailable when
        the key store is down and the key is not cached."""
        kind = CredentialType.API_KEY if looks_like_key(credential) else CredentialType.JWT
        try:
            principal = await self._authenticate(kind, credential)
        except ServiceError as err:
            self._metrics.authenticated(kind, getattr(err, "reason", type(err).__name__))
            raise
        self._metrics.authenticated(kind, "ok")
        return principal

    async def _authenticate(self, kind: CredentialType, credential: str) -> Principal:
        if len(credential) > MAX_CREDENTIAL_CHARS:
            raise Unauthenticated("credential is too long", reason="CREDENTIAL_MALFORMED")
        if kind is CredentialType.API_KEY:
            return await self._api_key(credential)
        if not looks_like_jwt(credential):
            message = "credential is not an API key or a JWT"
            raise Unauthenticated(message, reason="CREDENTIAL_MALFORMED")
        if self._jwt is None:
            raise Unauthenticated("JWTs are not accepted here", reason="JWT_NOT_ACCEPTED")
        return await self._jwt.verify(credential)

    async def _api_key(self, credential: str) -> Principal:
        try:
            key = parse_key(credential)
        except MalformedKeyError as exc:
            raise Unauthenticated(str(exc), reason="API_KEY_MALFORMED") from None
        now = self._clock_ms()
        record, from_store = self._recent(key.key_id, key, now), False
        if record is None:  # (a recent record has had this secret checked already)
            record, from_store = await self._lookup(key.key_id)
            # The secret is checked before anything else is revealed about the key.
            if record is None or not record.secret_matches(self._pepper, key, now):
                raise Unauthenticated("API key is invalid", reason="API_KEY_INVALID")
        if record.is_revoked():
            self._cache.pop(key.key_id)
            raise Unauthenticated("API key has been revoked", reason="API_KEY_REVOKED")
        if record.is_expired(now):
            raise Unauthenticated("API key has expired", reason="API_KEY_EXPIRED")
        if from_store:  # a cache hit must not extend its own life
            self._cache.put(key.key_id, record)
        return record.principal()

    def _recent(self, key_id: str, key: ParsedKey, now: int) -> KeyRecord | None:
        """The cached record if verified within `fresh_s` and the secret still matches it (a
        mismatch may be a just-rotated secret: Redis decides then)."""
        if self._fresh_s <= 0:
            return None
        record = self._cache.get(key_id, max_age_s=self._fresh_s)
        if record is None or not record.secret_matches(self._pepper, key, now):
            return None
        return record

    def forget(self, key_id: str) -> None:
        """Drop a cached key (it was revoked or rotated)."""
        self._cache.pop(key_id)

    def resync(self) -> None:
        """Stop trusting cached keys without Redis (announcements may have been missed)."""
        self._cache.mark_stale()

    async def _lookup(self, key_id: str) -> tuple[KeyRecord | None, bool]:
        """The record and whether it came from Redis (True) or the outage cache (False)."""
        try:
            record = await self._keys.get(key_id)
        except StoreUnavailable:
            cached = self._cache.get(key_id)
            self._metrics.cache_fallback(hit=cached is not None)
            if cached is None:
                message = "credential store unavailable"
                raise Unavailable(message, retry_after_s=STORE_RETRY_AFTER_S) from None
            return cached, False
        if record is None:
            self._cache.pop(key_id)
        return record, True

    async def record(self, key_id: str, max_age_s: float) -> KeyRecord | None:
        """A key's record for limit lookups: the cached one if younger than `max_age_s`, else
        Redis, else (Redis down) any cached one; StoreUnavailable if there is none."""
        cached = self._cache.get(key_id, max_age_s=max_age_s)
        if cached is not None:
            return cached
        try:
            record = await self._keys.get(key_id)
        except StoreUnavailable:
            stale = self._cache.get(key_id)
            if stale is None:
                raise
            return stale
        if record is not None:
            self._cache.put(key_id, record)
        return record
