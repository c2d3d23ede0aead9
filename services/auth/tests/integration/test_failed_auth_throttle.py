"""Attack (issue 32, finding 5): a stream of bad credentials is throttled per client address
and per key id, on both ext_authz transports (real auth server, real Redis)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
import pytest_asyncio
from envoy.service.auth.v3 import external_auth_pb2 as authz_pb
from envoy.service.auth.v3 import external_auth_pb2_grpc as authz_grpc
from google.rpc import error_details_pb2
from prometheus_client import CollectorRegistry

from llm_auth.apikeys import ParsedKey
from llm_auth.failure_throttle import ThrottleSettings
from llm_auth.metrics import AuthMetrics
from llm_auth.testing import AuthHarness, delete_prefix, make_settings, serving, unique_prefix

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.security]

LIMIT = 5
ATTACKER, NEIGHBOUR = "203.0.113.7", "198.51.100.2"
BAD = "sk-0123456789abcdef.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"


@pytest_asyncio.fixture
async def auth(redis_url: str) -> AsyncIterator[AuthHarness]:
    prefix = unique_prefix()
    settings = make_settings(
        redis_url,
        prefix,
        http_authz_port=0,
        failed_auth=ThrottleSettings(limit=LIMIT, window_s=60.0),
    )
    try:
        async with serving(settings, AuthMetrics(CollectorRegistry())) as h:
            yield h
    finally:
        await delete_prefix(redis_url, prefix)


async def http_check(
    auth: AuthHarness, key: str, address: str
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP ext_authz check as the edge sends it: the client's address in x-forwarded-for."""
    assert auth.app.http_authz is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", auth.app.http_authz.port)
    head = [
        "POST /authz/v1/chat/completions HTTP/1.1",
        "host: auth",
        "content-length: 0",
        f"x-api-key: {key}",
        f"x-forwarded-for: 10.0.0.1, {address}",
    ]
    writer.write(("\r\n".join(head) + "\r\n\r\n").encode())
    try:
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        status_line, *lines = raw[:-4].decode().split("\r\n")
        headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines)}
        body = await reader.readexactly(int(headers["content-length"]))
    finally:
        writer.close()
    return int(status_line.split(" ")[1]), headers, body


def wrong_secret(key: ParsedKey) -> str:
    return f"sk-{key.key_id}.{'B' * 43}"


def throttled(auth: AuthHarness, scope: str) -> float:
    metrics = auth.app.metrics.auth_throttles
    return metrics.labels(scope)._value.get()


async def test_bad_keys_from_one_address_get_429_after_the_limit(auth: AuthHarness) -> None:
    _, good = await auth.create_key("acme")
    statuses = [(await http_check(auth, BAD, ATTACKER))[0] for _ in range(LIMIT)]
    assert statuses == [401] * LIMIT
    status, headers, body = await http_check(auth, BAD, ATTACKER)
    assert status == 429
    assert 1 <= int(headers["retry-after"]) <= 60
    error = json.loads(body)["error"]
    assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded")
    assert "failed authentications" in error["message"]
    # The address is refused before any credential is checked, a valid one included ...
    assert (await http_check(auth, good.text, ATTACKER))[0] == 429
    # ... while the same key from another address is unaffected.
    assert (await http_check(auth, good.text, NEIGHBOUR))[0] == 200
    assert throttled(auth, "address") >= 2


async def test_a_key_ids_failures_are_throttled_but_its_owner_passes(auth: AuthHarness) -> None:
    _, key = await auth.create_key("acme")
    # One failure from each of many addresses: no address reaches its limit.
    for i in range(LIMIT):
        assert (await http_check(auth, wrong_secret(key), f"192.0.2.{i}"))[0] == 401
    status, headers, _ = await http_check(auth, wrong_secret(key), "192.0.2.100")
    assert status == 429
    assert "retry-after" in headers
    assert (await http_check(auth, key.text, "192.0.2.101"))[0] == 200
    assert throttled(auth, "key") == 1


async def test_grpc_check_uses_the_source_address_and_carries_retry_info(
    auth: AuthHarness,
) -> None:
    stub = authz_grpc.AuthorizationStub(auth.channel)
    request = authz_pb.CheckRequest()
    request.attributes.source.address.socket_address.address = ATTACKER
    http = request.attributes.request.http
    http.path = "/llmapi.llm.v1.LLMService/Chat"
    http.headers.update({"x-api-key": BAD, "content-type": "application/grpc"})
    for _ in range(LIMIT):
        reply = await stub.Check(request)
        assert reply.denied_response.status.code == 401
    reply = await stub.Check(request)
    assert reply.denied_response.status.code == 429
    assert reply.status.code == 8  # RESOURCE_EXHAUSTED
    assert reply.status.message.startswith("too many failed authentications")
    retry = error_details_pb2.RetryInfo()
    assert any(d.Unpack(retry) for d in reply.status.details)
    assert retry.retry_delay.seconds >= 1


async def test_off_when_the_limit_is_zero(redis_url: str) -> None:
    prefix = unique_prefix()
    settings = make_settings(redis_url, prefix, http_authz_port=0)
    settings = replace(settings, failed_auth=ThrottleSettings(limit=0))
    try:
        async with serving(settings, AuthMetrics(CollectorRegistry())) as h:
            statuses = {(await http_check(h, BAD, ATTACKER))[0] for _ in range(LIMIT + 3)}
            assert statuses == {401}
    finally:
        await delete_prefix(redis_url, prefix)
