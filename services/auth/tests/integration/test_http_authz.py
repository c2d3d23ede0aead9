"""Auth's HTTP ext_authz listener on a real socket (real Redis): keep-alive exchanges, the
shared decision, malformed and oversized requests, and shutdown. Through a real Envoy it is
covered by test_envoy.py, which runs every case on both transports."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from llm_auth.http_authz import MAX_HEAD_BYTES, REMOVE_HEADER, HttpAuthorizer, parse_head
from llm_auth.metrics import AuthMetrics
from llm_auth.testing import AuthHarness, delete_prefix, make_settings, serving, unique_prefix
from llm_common.metrics import RpcMetrics

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


@pytest.fixture
def rpc_metrics() -> RpcMetrics:
    return RpcMetrics(CollectorRegistry())


@pytest_asyncio.fixture
async def auth(redis_url: str, rpc_metrics: RpcMetrics) -> AsyncIterator[AuthHarness]:
    prefix = unique_prefix()
    metrics = AuthMetrics(CollectorRegistry())
    settings = make_settings(redis_url, prefix, http_authz_port=0)
    try:
        async with serving(settings, metrics, rpc_metrics) as h:
            yield h
    finally:
        await delete_prefix(redis_url, prefix)


class Conn:
    """One client connection speaking HTTP/1.1 as Envoy's ext_authz client does."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, auth: AuthHarness) -> Conn:
        assert auth.app.http_authz is not None
        return cls(*await asyncio.open_connection("127.0.0.1", auth.app.http_authz.port))

    async def ask(
        self, target: str, *headers: str, body: bytes = b""
    ) -> tuple[int, dict[str, str], bytes]:
        lines = [f"POST {target} HTTP/1.1", "host: auth", f"content-length: {len(body)}"]
        self.writer.write(("\r\n".join([*lines, *headers]) + "\r\n\r\n").encode() + body)
        return await self.reply()

    async def reply(self) -> tuple[int, dict[str, str], bytes]:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 5)
        status_line, *lines = head[:-4].decode().split("\r\n")
        headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines)}
        body = await self.reader.readexactly(int(headers["content-length"]))
        return int(status_line.split(" ")[1]), headers, body

    async def closed_by_peer(self) -> bool:
        return await asyncio.wait_for(self.reader.read(1), 5) == b""

    def close(self) -> None:
        self.writer.close()


async def test_keep_alive_answers_each_request_with_the_shared_decision(
    auth: AuthHarness, rpc_metrics: RpcMetrics
) -> None:
    record, key = await auth.create_key("acme", scopes=("completion:write",))
    conn = await Conn.open(auth)
    try:
        status, headers, _ = await conn.ask("/authz/v1/chat", f"x-api-key: {key.text}")
        assert status == 200
        assert (headers["x-tenant-id"], headers["x-key-id"]) == ("acme", record.key_id)
        assert "x-api-key" in headers[REMOVE_HEADER].split(",")
        # Same connection: a scope the key lacks is a 403 with a JSON body.
        status, headers, body = await conn.ask(
            "/authz;scopes=admin/v1/keys", f"authorization: Bearer {key.text}"
        )
        assert status == 403
        assert headers["content-type"] == "application/json"
        assert b"scope_missing" in body  # OpenAI's error object on /v1 (code = the reason)
        # A body (with_request_body) is read past, and health checks need no credential.
        status, headers, _ = await conn.ask("/authz/healthz", body=b"ignored")
        assert status == 200
        assert "x-tenant-id" not in headers
        status, headers, body = await conn.ask("/authz/v1/chat", "content-type: application/grpc")
        assert (status, headers["content-type"]) == (401, "text/plain")  # becomes grpc-message
        # The edge copies the client's content type into x-authz-content-type (the check
        # itself must not carry application/grpc: see llm_envoy.filters).
        status, headers, body = await conn.ask(
            "/authz/v1/chat", "x-authz-content-type: application/grpc"
        )
        assert (status, headers["content-type"]) == (401, "text/plain")
        status, _, body = await conn.ask("/healthz")  # Envoy's active health check
        assert (status, body) == (200, b"ok\n")
    finally:
        conn.close()
    answers = auth.app.metrics.ext_authz
    assert answers.labels("200")._value.get() == 2
    assert answers.labels("401")._value.get() == 2
    # Timed and counted like the gRPC Check: every answered check is OK, denials included;
    # the listener's own health probe is not a check.
    checks = rpc_metrics.requests
    assert checks.labels("ext_authz_http", "Check", "OK")._value.get() == 5
    assert rpc_metrics.in_flight.labels("ext_authz_http", "Check")._value.get() == 0


async def test_a_malformed_request_gets_400_and_the_connection_closes(auth: AuthHarness) -> None:
    conn = await Conn.open(auth)
    try:
        conn.writer.write(b"GARBAGE\r\n\r\n")
        status, headers, _ = await conn.reply()
        assert (status, headers["connection"]) == (400, "close")
        assert await conn.closed_by_peer()
    finally:
        conn.close()
    # The listener is unharmed.
    conn = await Conn.open(auth)
    try:
        assert (await conn.ask("/authz/healthz"))[0] == 200
    finally:
        conn.close()


async def test_an_oversized_head_gets_431(auth: AuthHarness) -> None:
    conn = await Conn.open(auth)
    try:
        status, _, _ = await conn.ask("/authz/v1/chat", "x-api-key: " + "a" * MAX_HEAD_BYTES)
        assert status == 431
        assert await conn.closed_by_peer()
    finally:
        conn.close()


async def test_stop_closes_idle_connections(auth: AuthHarness) -> None:
    conn = await Conn.open(auth)
    try:
        assert (await conn.ask("/authz/healthz"))[0] == 200
        assert auth.app.http_authz is not None
        await auth.app.http_authz.stop(1.0)
        assert await conn.closed_by_peer()
    finally:
        conn.close()


async def test_a_check_with_trace_context_joins_the_trace(auth: AuthHarness) -> None:
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    authorizer = HttpAuthorizer(
        auth.app.authz, RpcMetrics(CollectorRegistry()), provider.get_tracer("test")
    )
    trace_id = "0af7651916cd43dd8448eb211c80319c"
    traced = parse_head(
        b"POST /authz/v1/chat HTTP/1.1\r\n"
        + f"traceparent: 00-{trace_id}-b7ad6b7169203331-01".encode()
    )
    status_line = (await authorizer.answer(traced)).split(b"\r\n", 1)[0]
    assert status_line.startswith(b"HTTP/1.1 401")
    (span,) = spans.get_finished_spans()
    assert span.name == "/ext_authz_http/Check"
    assert span.context is not None
    assert f"{span.context.trace_id:032x}" == trace_id
    # Without trace context no span is made at all (the common, unsampled case).
    await authorizer.answer(parse_head(b"POST /authz/healthz HTTP/1.1"))
    assert len(spans.get_finished_spans()) == 1
