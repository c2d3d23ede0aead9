"""Redis outages, on a redis-server of the test's own that it stops: the key cache, fail-open
and fail-closed limits, and the metrics that count them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
import pytest_asyncio
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from envoy.service.ratelimit.v3 import rls_pb2_grpc as rls_grpc
from prometheus_client import CollectorRegistry

from llm_auth.config import FailureMode, RedisSettings
from llm_auth.metrics import AuthMetrics
from llm_auth.principal import KeyLimits
from llm_auth.testing import AuthHarness, make_settings, serving
from llm_common.errors import parse_error
from llm_testing import EmbeddedRedis, start_embedded_redis
from llmapi.auth.v1 import auth_service_pb2 as pb
from llmapi.auth.v1 import auth_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration
PREFIX = "auth-outage:"


@pytest.fixture
def own_redis() -> Iterator[EmbeddedRedis]:
    server = start_embedded_redis()
    try:
        yield server
    finally:
        server.stop()


def metric(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


def rls_request(tenant: str, key_id: str) -> rls_pb2.RateLimitRequest:
    descriptor = ratelimit_pb2.RateLimitDescriptor()
    descriptor.entries.add(key="tenant", value=tenant)
    descriptor.entries.add(key="key_id", value=key_id)
    return rls_pb2.RateLimitRequest(domain="llm-api", descriptors=[descriptor])


@pytest_asyncio.fixture(params=[FailureMode.OPEN, FailureMode.CLOSED], ids=["open", "closed"])
async def outage(
    request: pytest.FixtureRequest, own_redis: EmbeddedRedis
) -> AsyncIterator[tuple[AuthHarness, CollectorRegistry, FailureMode]]:
    mode: FailureMode = request.param
    registry = CollectorRegistry()
    settings = make_settings(
        own_redis.url,
        PREFIX,
        redis=RedisSettings(url=own_redis.url, prefix=PREFIX, timeout_s=2.0, breaker_reset_s=60),
        rate_limit_failure_mode=mode,
        key_cache_ttl_s=30,
        key_fresh_s=0,  # every check goes to Redis first: the outage path is what is tested
    )
    async with serving(settings, AuthMetrics(registry)) as auth:
        yield auth, registry, mode


async def test_verified_keys_survive_an_outage_and_limits_follow_the_policy(
    outage: tuple[AuthHarness, CollectorRegistry, FailureMode], own_redis: EmbeddedRedis
) -> None:
    auth, registry, mode = outage
    stub = pb_grpc.AuthServiceStub(auth.channel)
    rls = rls_grpc.RateLimitServiceStub(auth.channel)
    limits = KeyLimits(requests_per_minute=100, tokens_per_minute=100, max_concurrent=1)
    verified, verified_key = await auth.create_key("acme", limits=limits)
    _, unverified_key = await auth.create_key("acme")
    await stub.Authenticate(pb.AuthenticateRequest(credential=verified_key.text))
    assert (await rls.ShouldRateLimit(rls_request("acme", verified.key_id))).overall_code == 1

    own_redis.stop()

    reply = await stub.Authenticate(pb.AuthenticateRequest(credential=verified_key.text))
    assert reply.principal.key_id == verified.key_id
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Authenticate(pb.AuthenticateRequest(credential=unverified_key.text))
    details = parse_error(caught.value)
    assert details.code == grpc.StatusCode.UNAVAILABLE
    assert details.retry_after_s == 1.0
    # A wrong secret for a cached key id is still refused.
    forged = verified_key.text[:-4] + "AAAA"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.Authenticate(pb.AuthenticateRequest(credential=forged))
    assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert metric(registry, "llm_auth_key_cache_fallbacks_total", outcome="hit") == 2
    assert metric(registry, "llm_auth_key_cache_fallbacks_total", outcome="miss") == 1

    verdict = await rls.ShouldRateLimit(rls_request("acme", verified.key_id))
    reserve = stub.ReserveTokens(
        pb.ReserveTokensRequest(
            tenant_id="acme", key_id=verified.key_id, tokens=10, reservation_id="r"
        )
    )
    if mode is FailureMode.OPEN:
        assert verdict.overall_code == rls_pb2.RateLimitResponse.OK
        granted = await reserve
        assert not granted.enforced
    else:
        assert verdict.overall_code == rls_pb2.RateLimitResponse.OVER_LIMIT
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await reserve
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    failures = metric(
        registry,
        "llm_auth_rate_limit_store_failures_total",
        kind="requests",
        mode=mode.value,
    )
    assert failures == 1


async def test_cached_keys_expire_after_the_ttl(own_redis: EmbeddedRedis) -> None:
    settings = make_settings(own_redis.url, PREFIX, key_cache_ttl_s=0.3, key_fresh_s=0)
    async with serving(settings) as auth:
        stub = pb_grpc.AuthServiceStub(auth.channel)
        _, key = await auth.create_key("acme")
        await stub.Authenticate(pb.AuthenticateRequest(credential=key.text))
        own_redis.stop()
        await stub.Authenticate(pb.AuthenticateRequest(credential=key.text))
        await asyncio.sleep(0.35)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await stub.Authenticate(pb.AuthenticateRequest(credential=key.text))
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
