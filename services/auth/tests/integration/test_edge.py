"""The edge listener (AUTH_EDGE_PORT): Envoy's ext_authz and rate-limit calls without the
interceptors, still metered and with errors mapped; a real Envoy in front of it."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.auth.v3 import external_auth_pb2 as authz_pb
from envoy.service.ratelimit.v3 import rls_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from llm_auth.config import RedisSettings
from llm_auth.edge import AUTHZ_SERVICE, RLS_SERVICE, metered
from llm_auth.principal import KeyLimits
from llm_auth.server import serve
from llm_auth.testing import (
    AuthHarness,
    echo_upstream,
    echoed_headers,
    make_settings,
    render,
    running_envoy,
    serving,
)
from llm_common.metrics import RpcMetrics
from llm_common.server import BuiltServer
from llm_testing import free_port, start_embedded_redis

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

TEMPLATE = Path(__file__).with_name("envoy.yaml.tmpl")
Call = grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]


def count(registry: CollectorRegistry, service: str, method: str, code: str) -> float:
    labels = {"service": service, "method": method, "code": code}
    return registry.get_sample_value("llm_rpc_requests_total", labels) or 0.0


async def test_edge_listener_is_off_by_default(redis_url: str, prefix: str) -> None:
    async with serving(make_settings(redis_url, prefix)) as auth:
        assert auth.app.edge is None


async def test_envoy_through_the_edge_listener(
    redis_url: str, prefix: str, unique_tenant: str, tmp_path: Path
) -> None:
    registry = CollectorRegistry()
    settings = make_settings(redis_url, prefix, edge_port=0)
    async with serving(settings, rpc_metrics=RpcMetrics(registry)) as auth, echo_upstream() as up:
        assert auth.app.edge is not None
        record, key = await auth.create_key(unique_tenant, limits=KeyLimits(requests_per_minute=2))
        port = free_port()
        config = render(
            TEMPLATE, listener_port=port, upstream_port=up, auth_port=auth.app.edge.port
        )
        async with (
            running_envoy(config, tmp_path / "envoy"),
            grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel,
        ):
            echo: Call = channel.unary_unary("/echo.Echo/Headers")
            limited: Call = channel.unary_unary("/echo.Limited/Headers")
            for _ in range(2):  # the second call is answered from the cached reply
                seen = echoed_headers(await echo(b"{}", metadata=[("x-api-key", key.text)]))
                assert ("x-tenant-id", unique_tenant) in seen
                assert ("x-key-id", record.key_id) in seen
                assert all(name != "x-api-key" for name, _ in seen)
            # A different last character (one in 64 keys already ends in "A").
            tampered = key.text[:-1] + ("B" if key.text.endswith("A") else "A")
            with pytest.raises(grpc.aio.AioRpcError) as denied:
                await echo(b"{}", metadata=[("x-api-key", tampered)], timeout=5)
            assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
            for _ in range(2):
                await limited(b"{}", metadata=[("x-api-key", key.text)], timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as over:
                await limited(b"{}", metadata=[("x-api-key", key.text)], timeout=5)
            assert over.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert count(registry, AUTHZ_SERVICE, "Check", "OK") == 6
    assert count(registry, RLS_SERVICE, "ShouldRateLimit", "OK") == 3


async def test_edge_maps_bad_requests_and_answers_probes(redis_url: str, prefix: str) -> None:
    registry = CollectorRegistry()
    settings = make_settings(redis_url, prefix, edge_port=0)
    async with serving(settings, rpc_metrics=RpcMetrics(registry)) as auth:
        assert auth.app.edge is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{auth.app.edge.port}") as channel:
            call = channel.unary_unary(
                f"/{RLS_SERVICE}/ShouldRateLimit",
                request_serializer=rls_pb2.RateLimitRequest.SerializeToString,
                response_deserializer=rls_pb2.RateLimitResponse.FromString,
            )
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(rls_pb2.RateLimitRequest(domain=""), timeout=5)
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", AUTHZ_SERVICE, RLS_SERVICE):
                reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
                assert reply.status == health_pb2.HealthCheckResponse.SERVING
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    trailers = dict(caught.value.trailing_metadata() or ())
    assert "grpc-status-details-bin" in trailers  # google.rpc BadRequest details
    assert count(registry, RLS_SERVICE, "ShouldRateLimit", "INVALID_ARGUMENT") == 1


async def test_metered_hides_unexpected_errors() -> None:
    registry = CollectorRegistry()

    async def broken(request: bytes, context: Any) -> bytes:
        raise RuntimeError("secret internals")

    handler: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_unary_rpc_method_handler(
        metered(broken, "test.Svc", "Broken", RpcMetrics(registry))
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("test.Svc", {"Broken": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            call: Call = channel.unary_unary("/test.Svc/Broken")
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(b"", timeout=5)
    finally:
        await server.stop(0)
    assert caught.value.code() == grpc.StatusCode.INTERNAL
    assert "secret" not in (caught.value.details() or "")
    assert count(registry, "test.Svc", "Broken", "INTERNAL") == 1


async def test_serve_takes_start_up_objects_out_of_the_gc(redis_url: str, prefix: str) -> None:
    stop = asyncio.Event()
    frozen: list[int] = []

    def ready(_: BuiltServer) -> None:
        frozen.append(gc.get_freeze_count())
        stop.set()

    before = gc.get_freeze_count()
    try:
        await asyncio.wait_for(serve(make_settings(redis_url, prefix), stop=stop, ready=ready), 30)
    finally:
        gc.unfreeze()
    assert len(frozen) == 1
    assert frozen[0] > before


async def test_a_recently_verified_key_is_checked_without_redis() -> None:
    own_redis = start_embedded_redis()  # its own server: nobody else's commands are counted
    redis = RedisSettings(url=own_redis.url, prefix="auth-edge:", timeout_s=2.0)
    settings = make_settings(own_redis.url, "auth-edge:", redis=redis, edge_port=0, key_fresh_s=60)
    try:
        async with serving(settings) as auth:
            assert auth.app.edge is not None
            _, key = await auth.create_key("acme")
            request = check_request(key.text).SerializeToString()
            async with grpc.aio.insecure_channel(f"127.0.0.1:{auth.app.edge.port}") as channel:
                check: Call = channel.unary_unary(f"/{AUTHZ_SERVICE}/Check")
                first = authz_pb.CheckResponse.FromString(await check(request, timeout=5))
                before = await commands_processed(auth)
                replies = [await check(request, timeout=5) for _ in range(20)]
                after = await commands_processed(auth)
    finally:
        own_redis.stop()
    assert first.status.code == 0
    assert first.ok_response.headers[0].header.value == "acme"
    assert all(authz_pb.CheckResponse.FromString(reply) == first for reply in replies)
    assert after - before == 1  # the INFO that read the counter: no key lookups


async def commands_processed(auth: AuthHarness) -> int:
    stats = await auth.app.redis.info("stats")
    return int(stats["total_commands_processed"])


def check_request(api_key: str) -> authz_pb.CheckRequest:
    request = authz_pb.CheckRequest()
    http = request.attributes.request.http
    http.path = "/echo.Echo/Headers"
    http.headers.update({"x-api-key": api_key, "content-type": "application/grpc"})
    return request
