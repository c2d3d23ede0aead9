"""JSON Web Key Sets from a file or a URL, cached, refreshed on expiry or on an unknown kid."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

import jwt

from llm_common.errors import Unauthenticated, Unavailable
from llm_common.logging import get_logger

MAX_JWKS_BYTES = 1 << 20
MAX_JWKS_KEYS = 100
Loader = Callable[[], Awaitable[bytes]]
KeySet = Mapping[str | None, jwt.PyJWK]
_log = get_logger(__name__)


class JwksError(ValueError):
    """The key set could not be fetched or parsed."""


def file_loader(path: Path) -> Loader:
    """Reads the JWKS file on each (rate-limited) refresh, so replacing it rotates keys."""

    async def load() -> bytes:
        try:
            data = await asyncio.to_thread(path.read_bytes)
        except OSError as exc:
            raise JwksError(f"cannot read JWKS file: {exc.strerror}") from None
        if len(data) > MAX_JWKS_BYTES:
            raise JwksError("JWKS file is too large")
        return data

    return load


def url_loader(url: str, timeout_s: float) -> Loader:
    """Fetches the JWKS over HTTP(S) in a worker thread, at most MAX_JWKS_BYTES."""

    def fetch() -> bytes:
        request = urllib.request.Request(url, headers={"accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                data: bytes = response.read(MAX_JWKS_BYTES + 1)
        except (OSError, ValueError) as exc:
            raise JwksError(f"cannot fetch JWKS: {type(exc).__name__}") from None
        if len(data) > MAX_JWKS_BYTES:
            raise JwksError("JWKS document is too large")
        return data

    async def load() -> bytes:
        return await asyncio.to_thread(fetch)

    return load


def parse_jwks(raw: bytes) -> dict[str | None, jwt.PyJWK]:
    """Asymmetric keys by kid. Symmetric (`oct`) keys are ignored: HS256 secrets come from
    configuration only, so a published key can never become an HMAC secret."""
    try:
        document = json.loads(raw)
        entries = document["keys"]
    except (ValueError, TypeError, KeyError):
        raise JwksError("not a JWKS document") from None
    if not isinstance(entries, list) or len(entries) > MAX_JWKS_KEYS:
        raise JwksError(f"JWKS must hold a list of at most {MAX_JWKS_KEYS} keys")
    keys: dict[str | None, jwt.PyJWK] = {}
    for entry in entries:
        if not isinstance(entry, dict) or entry.get("kty") not in ("RSA", "EC"):
            continue
        try:
            key = jwt.PyJWK(entry)
        except (jwt.PyJWKError, jwt.InvalidKeyError, ValueError, TypeError):
            _log.warning("skipping unusable JWKS entry", kid=str(entry.get("kid")))
            continue
        keys[key.key_id] = key
    return keys


def select_key(keys: KeySet, kid: str | None, alg: str) -> jwt.PyJWK | None:
    """The key for `kid` if it is meant for `alg`; without a kid, the only key for `alg`."""
    if kid is not None:
        key = keys.get(kid)
        return key if key is not None and key.algorithm_name == alg else None
    candidates = [key for key in keys.values() if key.algorithm_name == alg]
    return candidates[0] if len(candidates) == 1 else None


class JwksCache:
    """The current key set, loaded lazily; an unknown kid triggers a refresh at most every
    `min_refresh_s`, which is how key rotation reaches this service."""

    def __init__(
        self,
        loader: Loader,
        *,
        ttl_s: float,
        min_refresh_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._loader = loader
        self._ttl_s = ttl_s
        self._min_refresh_s = min_refresh_s
        self._clock = clock
        self._keys: KeySet | None = None
        self._loaded_at = -float("inf")
        self._attempted_at = -float("inf")
        self._lock = asyncio.Lock()

    async def find(self, kid: str | None, alg: str) -> jwt.PyJWK:
        """The verification key; Unauthenticated if unknown, Unavailable if none can load."""
        stale = self._keys is None or self._clock() - self._loaded_at >= self._ttl_s
        if stale and self._may_refresh():
            await self._refresh(force=False)
        key = select_key(self._keys or {}, kid, alg)
        if key is None and self._may_refresh():
            await self._refresh(force=True)
            key = select_key(self._keys or {}, kid, alg)
        if key is not None:
            return key
        if self._keys is None:
            raise Unavailable("token signing keys are unavailable", retry_after_s=1.0)
        raise Unauthenticated("token signed with an unknown key", reason="JWT_KEY_UNKNOWN")

    def _may_refresh(self) -> bool:
        # Bounds the load on the key server, also while it is failing.
        return self._clock() - self._attempted_at >= self._min_refresh_s

    async def _refresh(self, *, force: bool) -> None:
        attempted = self._attempted_at
        async with self._lock:
            if self._attempted_at != attempted:
                return  # another task refreshed while this one waited
            self._attempted_at = self._clock()
            try:
                keys = parse_jwks(await self._loader())
            except JwksError as exc:
                level = logging.WARNING if self._keys is None or force else logging.INFO
                _log.log(level, "JWKS refresh failed; keeping the previous keys", error=str(exc))
                return
            self._keys, self._loaded_at = keys, self._clock()
