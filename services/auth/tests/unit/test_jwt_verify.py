"""JWT verification against a JWKS file: algorithms, claims, confusion attacks, rotation."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import time
from pathlib import Path
from typing import Any

import pytest

from llm_auth.config import DefaultLimits, JwtSettings
from llm_auth.jwks import JwksCache, file_loader, parse_jwks
from llm_auth.jwt_verify import JwtVerifier
from llm_auth.principal import CredentialType
from llm_auth.testing import JwtSigner, standard_claims
from llm_common.errors import Unauthenticated, Unavailable

ISSUER, AUDIENCE = "https://issuer.test", "llm-api"


@pytest.fixture(scope="module")
def signer() -> JwtSigner:
    return JwtSigner.generate()


def settings(jwks_file: Path, signer: JwtSigner, **overrides: Any) -> JwtSettings:
    values: dict[str, Any] = {
        "algorithms": ("HS256", "RS256", "ES256"),
        "hs256_secret": signer.hs256_secret,
        "jwks_file": jwks_file,
        "issuer": ISSUER,
        "audience": AUDIENCE,
        "leeway_s": 5.0,
        "jwks_min_refresh_s": 0.0,
    }
    values.update(overrides)
    return JwtSettings(**values)


@pytest.fixture
def jwks_file(tmp_path: Path, signer: JwtSigner) -> Path:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(signer.jwks()))
    return path


@pytest.fixture
def verifier(jwks_file: Path, signer: JwtSigner) -> JwtVerifier:
    limits = DefaultLimits(jwt_requests_per_minute=60, jwt_tokens_per_minute=1000)
    return JwtVerifier(settings(jwks_file, signer), limits)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


async def reason_of(verifier: JwtVerifier, token: str) -> str:
    with pytest.raises(Unauthenticated) as caught:
        await verifier.verify(token)
    return caught.value.reason


@pytest.mark.parametrize("alg", ["RS256", "ES256", "HS256"])
async def test_valid_tokens_map_claims(verifier: JwtVerifier, signer: JwtSigner, alg: str) -> None:
    claims = standard_claims(ISSUER, AUDIENCE, "acme", models=["demo-llama"])
    principal = await verifier.verify(signer.token(alg, claims))
    assert principal.tenant_id == "acme"
    assert principal.key_id == "jwt:user-1"
    assert principal.credential_type is CredentialType.JWT
    assert principal.scopes == ("completion:write", "embedding:read")
    assert principal.allowed_models == ("demo-llama",)
    assert principal.limits.requests_per_minute == 60


async def test_scope_list_claims_are_accepted(verifier: JwtVerifier, signer: JwtSigner) -> None:
    claims = standard_claims(ISSUER, AUDIENCE, "acme", scope=["a:b", "c"])
    assert (await verifier.verify(signer.token("RS256", claims))).scopes == ("a:b", "c")


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"exp": 1}, "JWT_EXPIRED"),
        ({"nbf": 4_000_000_000}, "JWT_NOT_YET_VALID"),
        ({"iat": 4_000_000_000}, "JWT_NOT_YET_VALID"),
        ({"aud": "other"}, "JWT_AUDIENCE_INVALID"),
        ({"iss": "https://evil.test"}, "JWT_ISSUER_INVALID"),
        ({"tenant_id": "{bad}"}, "JWT_CLAIM_INVALID"),
        ({"tenant_id": None}, "JWT_CLAIM_INVALID"),
        ({"scope": 7}, "JWT_CLAIM_INVALID"),
    ],
)
async def test_claim_failures(
    verifier: JwtVerifier, signer: JwtSigner, overrides: dict[str, Any], reason: str
) -> None:
    merged = {**standard_claims(ISSUER, AUDIENCE, "acme"), **overrides}
    claims = {k: v for k, v in merged.items() if v is not None}
    assert await reason_of(verifier, signer.token("RS256", claims)) == reason


async def test_missing_exp_is_rejected(verifier: JwtVerifier, signer: JwtSigner) -> None:
    claims = standard_claims(ISSUER, AUDIENCE, "acme")
    del claims["exp"]
    assert await reason_of(verifier, signer.token("ES256", claims)) == "JWT_CLAIM_MISSING"


async def test_leeway_tolerates_small_clock_skew(verifier: JwtVerifier, signer: JwtSigner) -> None:
    claims = standard_claims(ISSUER, AUDIENCE, "acme", ttl_s=-2)  # expired 2 s ago, leeway 5 s
    assert (await verifier.verify(signer.token("RS256", claims))).tenant_id == "acme"


async def test_alg_none_is_rejected(verifier: JwtVerifier) -> None:
    header = b64(json.dumps({"alg": "none", "typ": "JWT"}).encode())
    body = b64(json.dumps(standard_claims(ISSUER, AUDIENCE, "acme")).encode())
    assert await reason_of(verifier, f"{header}.{body}.") == "JWT_ALGORITHM_NOT_ALLOWED"


async def test_tampered_payload_is_rejected(verifier: JwtVerifier, signer: JwtSigner) -> None:
    header, _, signature = signer.token("RS256", standard_claims(ISSUER, AUDIENCE, "a")).split(".")
    forged = b64(json.dumps(standard_claims(ISSUER, AUDIENCE, "victim")).encode())
    token = f"{header}.{forged}.{signature}"
    assert await reason_of(verifier, token) == "JWT_SIGNATURE_INVALID"


async def test_hs256_signed_with_the_rsa_public_key_is_rejected(
    verifier: JwtVerifier, signer: JwtSigner
) -> None:
    header = b64(json.dumps({"alg": "HS256", "kid": signer.rsa_kid}).encode())
    body = b64(json.dumps(standard_claims(ISSUER, AUDIENCE, "acme")).encode())
    mac = hmac.new(signer.rsa_public_pem(), f"{header}.{body}".encode(), hashlib.sha256)
    token = f"{header}.{body}.{b64(mac.digest())}"
    assert await reason_of(verifier, token) == "JWT_SIGNATURE_INVALID"


async def test_rs_token_claiming_the_ec_kid_is_rejected(
    verifier: JwtVerifier, signer: JwtSigner
) -> None:
    token = signer.token("RS256", standard_claims(ISSUER, AUDIENCE, "a"), kid=signer.ec_kid)
    assert await reason_of(verifier, token) == "JWT_KEY_UNKNOWN"


async def test_algorithms_outside_the_allow_list_are_rejected(
    jwks_file: Path, signer: JwtSigner
) -> None:
    rs_only = JwtVerifier(
        settings(jwks_file, signer, algorithms=("RS256",), hs256_secret=None), DefaultLimits()
    )
    token = signer.token("ES256", standard_claims(ISSUER, AUDIENCE, "a"))
    assert await reason_of(rs_only, token) == "JWT_ALGORITHM_NOT_ALLOWED"


async def test_malformed_tokens(verifier: JwtVerifier) -> None:
    assert await reason_of(verifier, "eyJ.not.valid") == "JWT_MALFORMED"
    assert await reason_of(verifier, "e" * 9000) == "JWT_MALFORMED"


async def test_key_rotation_by_kid_reloads_the_file(
    jwks_file: Path, signer: JwtSigner, verifier: JwtVerifier
) -> None:
    claims = standard_claims(ISSUER, AUDIENCE, "acme")
    await verifier.verify(signer.token("RS256", claims))
    rotated = JwtSigner.generate()
    new_kid = "rsa-2"
    document = signer.jwks()
    new_key = {**rotated.jwks()["keys"][0], "kid": new_kid}
    text = json.dumps({"keys": [*document["keys"], new_key]})
    await asyncio.to_thread(jwks_file.write_text, text)
    token = rotated.token("RS256", claims, kid=new_kid)
    assert (await verifier.verify(token)).tenant_id == "acme"


def test_symmetric_and_broken_jwks_entries_are_ignored(signer: JwtSigner) -> None:
    document = signer.jwks()
    document["keys"] += [{"kty": "oct", "k": "c2VjcmV0", "kid": "hmac"}, {"kty": "RSA", "kid": "x"}]
    keys = parse_jwks(json.dumps(document).encode())
    assert set(keys) == {signer.rsa_kid, signer.ec_kid}


async def test_unreadable_jwks_is_unavailable(tmp_path: Path) -> None:
    cache = JwksCache(file_loader(tmp_path / "missing.json"), ttl_s=60, min_refresh_s=0)
    with pytest.raises(Unavailable):
        await cache.find("rsa-1", "RS256")


async def test_verified_tokens_are_remembered_until_they_expire(
    jwks_file: Path, signer: JwtSigner
) -> None:
    now = [time.time()]
    jwt = JwtVerifier(
        settings(jwks_file, signer, leeway_s=0), DefaultLimits(), clock=lambda: now[0]
    )
    token = signer.token("ES256", standard_claims(ISSUER, AUDIENCE, "acme", ttl_s=60))
    await jwt.verify(token)
    await asyncio.to_thread(jwks_file.write_text, '{"keys": []}')
    assert (await jwt.verify(token)).tenant_id == "acme"  # no key needed: remembered
    now[0] += 61
    assert await reason_of(jwt, token) == "JWT_EXPIRED"
