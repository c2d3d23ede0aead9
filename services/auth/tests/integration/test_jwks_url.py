"""JWKS fetched over HTTP from a small asyncio server: caching and key rotation by kid."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio

from llm_auth.config import DefaultLimits, JwtSettings
from llm_auth.jwt_verify import JwtVerifier
from llm_auth.testing import JwtSigner, standard_claims
from llm_common.errors import Unauthenticated, Unavailable

pytestmark = pytest.mark.integration
ISSUER, AUDIENCE = "https://issuer.test", "llm-api"


@dataclass
class JwksServer:
    """Serves `document` at /jwks.json and counts the fetches."""

    document: dict[str, Any]
    port: int = 0
    fetches: int = 0
    status: int = 200
    _server: asyncio.Server | None = field(default=None, repr=False)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        self.fetches += 1
        body = json.dumps(self.document).encode()
        head = f"HTTP/1.1 {self.status} X\r\ncontent-type: application/json\r\n"
        writer.write(f"{head}content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode())
        writer.write(body)
        await writer.drain()
        writer.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/jwks.json"


@pytest_asyncio.fixture
async def jwks_server() -> AsyncIterator[tuple[JwksServer, JwtSigner]]:
    signer = JwtSigner.generate()
    served = JwksServer(signer.jwks())
    server = await asyncio.start_server(served.handle, "127.0.0.1", 0)
    served.port = server.sockets[0].getsockname()[1]
    async with server:
        yield served, signer


def verifier(url: str, min_refresh_s: float = 0.0) -> JwtVerifier:
    settings = JwtSettings(
        jwks_url=url,
        issuer=ISSUER,
        audience=AUDIENCE,
        jwks_min_refresh_s=min_refresh_s,
        jwks_timeout_s=2.0,
    )
    return JwtVerifier(settings, DefaultLimits())


async def test_keys_are_fetched_once_and_rotated_by_kid(
    jwks_server: tuple[JwksServer, JwtSigner],
) -> None:
    served, signer = jwks_server
    jwt = verifier(served.url)
    claims = standard_claims(ISSUER, AUDIENCE, "acme")
    for alg in ("RS256", "ES256", "RS256"):
        assert (await jwt.verify(signer.token(alg, claims))).tenant_id == "acme"
    assert served.fetches == 1

    successor = JwtSigner.generate()
    served.document = {"keys": [{**successor.jwks()["keys"][0], "kid": "rsa-2"}]}
    rotated = successor.token("RS256", claims, kid="rsa-2")
    assert (await jwt.verify(rotated)).tenant_id == "acme"
    assert served.fetches == 2
    with pytest.raises(Unauthenticated) as caught:  # the old key is gone after the rotation
        await jwt.verify(signer.token("RS256", claims, kid="retired"))
    assert caught.value.reason == "JWT_KEY_UNKNOWN"


async def test_unknown_kids_refetch_at_most_every_min_refresh(
    jwks_server: tuple[JwksServer, JwtSigner],
) -> None:
    served, signer = jwks_server
    jwt = verifier(served.url, min_refresh_s=60)
    claims = standard_claims(ISSUER, AUDIENCE, "acme")
    await jwt.verify(signer.token("RS256", claims))
    for _ in range(5):
        with pytest.raises(Unauthenticated):
            await jwt.verify(signer.token("RS256", claims, kid="made-up"))
    assert served.fetches == 1


async def test_unreachable_jwks_is_unavailable_not_unauthenticated(
    jwks_server: tuple[JwksServer, JwtSigner],
) -> None:
    served, signer = jwks_server
    served.status = 500
    served.document = {"error": "boom"}
    with pytest.raises(Unavailable):
        await verifier(served.url).verify(
            signer.token("RS256", standard_claims(ISSUER, AUDIENCE, "acme"))
        )
