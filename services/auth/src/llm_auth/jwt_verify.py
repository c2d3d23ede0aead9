"""JWT verification: algorithm allow-list, keys by family, standard claims, claim mapping."""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import jwt

from llm_auth.config import DefaultLimits, JwtSettings
from llm_auth.jwks import JwksCache, file_loader, url_loader
from llm_auth.principal import CredentialType, KeyLimits, Principal
from llm_auth.ttl_cache import TtlCache
from llm_common.errors import Unauthenticated

MAX_JWT_CHARS = 8192
MAX_CLAIM_ITEMS = 64
VERIFIED_CACHE_ENTRIES = 10_000
JWT_KEY_PREFIX = "jwt:"  # principal key ids of JWT subjects, never confused with API key ids
_TENANT_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")
_SUBJECT_PATTERN = re.compile(r"[\x21-\x7e]{1,256}")  # printable ASCII: safe in a header
_ITEM_PATTERN = re.compile(r"[\x21-\x7e]{1,128}")
_REQUIRED_CLAIMS = ["exp", "iat", "sub", "iss", "aud"]
# PyJWT's exception -> (reason, client message). Order matters: subclasses first.
_FAILURES: tuple[tuple[type[jwt.InvalidTokenError], str, str], ...] = (
    (jwt.ExpiredSignatureError, "JWT_EXPIRED", "token has expired"),
    (jwt.ImmatureSignatureError, "JWT_NOT_YET_VALID", "token is not valid yet"),
    (jwt.InvalidAudienceError, "JWT_AUDIENCE_INVALID", "token audience is not accepted"),
    (jwt.InvalidIssuerError, "JWT_ISSUER_INVALID", "token issuer is not accepted"),
    (jwt.MissingRequiredClaimError, "JWT_CLAIM_MISSING", "token lacks a required claim"),
    (jwt.InvalidSignatureError, "JWT_SIGNATURE_INVALID", "token signature is invalid"),
    (jwt.DecodeError, "JWT_MALFORMED", "token is malformed"),
)


def looks_like_jwt(text: str) -> bool:
    """Three base64url segments separated by dots."""
    return text.count(".") == 2 and text.startswith("ey")


class JwtVerifier:
    """Verifies HS256 (configured secret), RS256 and ES256 (JWKS) tokens.

    The algorithm named in the token header must be on the allow-list, and the key is chosen
    by that algorithm's family: HS256 only ever uses the configured secret, RS256/ES256 only
    JWKS keys of the matching type. So `alg: none` and an RSA public key used as an HMAC
    secret are both rejected.
    """

    def __init__(
        self,
        settings: JwtSettings,
        limits: DefaultLimits,
        jwks: JwksCache | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._clock = clock
        # Verified tokens by digest: a repeated token skips the signature check until it
        # expires or the entry ages out (so a key dropped from the JWKS stops working then).
        self._verified = TtlCache[str, tuple[Principal, float]](
            settings.verified_cache_ttl_s, VERIFIED_CACHE_ENTRIES
        )
        self._limits = KeyLimits(
            requests_per_minute=limits.jwt_requests_per_minute,
            tokens_per_minute=limits.jwt_tokens_per_minute,
            max_concurrent=limits.jwt_max_concurrent,
        )
        self._jwks = jwks if jwks is not None else _jwks_for(settings)

    async def verify(self, token: str) -> Principal:
        """The principal of a valid token; Unauthenticated with a JWT_* reason otherwise."""
        if len(token) > MAX_JWT_CHARS:
            raise Unauthenticated("token is too long", reason="JWT_MALFORMED")
        token_digest = hashlib.sha256(token.encode()).hexdigest()
        cached = self._verified.get(token_digest)
        if cached is not None:
            principal, expires_at = cached
            if self._clock() >= expires_at + self._settings.leeway_s:
                raise Unauthenticated("token has expired", reason="JWT_EXPIRED")
            return principal
        alg, kid = _header(token)
        if alg not in self._settings.algorithms:
            raise Unauthenticated(
                "token algorithm is not accepted", reason="JWT_ALGORITHM_NOT_ALLOWED"
            )
        claims = self._decode(token, alg, await self._key(alg, kid))
        principal = self._principal(claims)
        if self._settings.verified_cache_ttl_s > 0:
            self._verified.put(token_digest, (principal, float(claims["exp"])))
        return principal

    async def _key(self, alg: str, kid: str | None) -> Any:
        if alg == "HS256":
            return self._settings.hs256_secret
        if self._jwks is None:
            raise Unauthenticated("token algorithm is not accepted", reason="JWT_KEY_UNKNOWN")
        return await self._jwks.find(kid, alg)

    def _decode(self, token: str, alg: str, key: Any) -> dict[str, Any]:
        s = self._settings
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=s.audience,
                issuer=s.issuer,
                leeway=s.leeway_s,
                options={"require": _REQUIRED_CLAIMS},
            )
        except jwt.InvalidTokenError as exc:
            raise _denial(exc) from None
        return claims

    def _principal(self, claims: Mapping[str, Any]) -> Principal:
        s = self._settings
        tenant = claims.get(s.tenant_claim)
        subject = claims.get("sub")
        if not isinstance(tenant, str) or not _TENANT_PATTERN.fullmatch(tenant):
            message = f"token claim {s.tenant_claim!r} is missing or invalid"
            raise Unauthenticated(message, reason="JWT_CLAIM_INVALID")
        if not isinstance(subject, str) or not _SUBJECT_PATTERN.fullmatch(subject):
            raise Unauthenticated("token claim 'sub' is invalid", reason="JWT_CLAIM_INVALID")
        return Principal(
            tenant_id=tenant,
            key_id=JWT_KEY_PREFIX + subject,
            credential_type=CredentialType.JWT,
            scopes=_items(claims.get(s.scopes_claim), s.scopes_claim),
            allowed_models=_items(claims.get(s.models_claim), s.models_claim),
            limits=self._limits,
        )


def _jwks_for(settings: JwtSettings) -> JwksCache | None:
    if settings.jwks_file is not None:
        loader = file_loader(settings.jwks_file)
    elif settings.jwks_url is not None:
        loader = url_loader(settings.jwks_url, settings.jwks_timeout_s)
    else:
        return None
    return JwksCache(
        loader, ttl_s=settings.jwks_cache_ttl_s, min_refresh_s=settings.jwks_min_refresh_s
    )


def _header(token: str) -> tuple[str, str | None]:
    try:
        header = jwt.get_unverified_header(token)
    except jwt.DecodeError:
        raise Unauthenticated("token is malformed", reason="JWT_MALFORMED") from None
    alg, kid = header.get("alg"), header.get("kid")
    if not isinstance(alg, str) or (kid is not None and not isinstance(kid, str)):
        raise Unauthenticated("token header is malformed", reason="JWT_MALFORMED")
    return alg, kid


def _items(value: Any, claim: str) -> tuple[str, ...]:
    """A space-separated string or a list of strings (RFC 8693 `scope` or `scp` style)."""
    if value is None:
        return ()
    items = value.split() if isinstance(value, str) else value
    valid = isinstance(items, list) and len(items) <= MAX_CLAIM_ITEMS
    if not valid or not all(isinstance(i, str) and _ITEM_PATTERN.fullmatch(i) for i in items):
        raise Unauthenticated(f"token claim {claim!r} is invalid", reason="JWT_CLAIM_INVALID")
    return tuple(items)


def _denial(exc: jwt.InvalidTokenError) -> Unauthenticated:
    for kind, reason, message in _FAILURES:
        if isinstance(exc, kind):
            return Unauthenticated(message, reason=reason)
    return Unauthenticated("token is invalid", reason="JWT_INVALID")
