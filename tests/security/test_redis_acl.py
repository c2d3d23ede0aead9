"""Threat 7 (docs/security.md): one Redis ACL user per service. On a redis-server loading the
ACL file (llm_common.redis_acl), each service's real operations succeed with its own user and
nothing it does is refused (ACL LOG stays empty), while another service's credentials, the
default user and administrative commands are refused."""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry
from redis.exceptions import AuthenticationError, NoPermissionError, ResponseError

from llm_auth.principal import KeyLimits
from llm_auth.testing import make_settings, serving
from llm_billing.config import LedgerSettings, RedisSettings, Settings, UsageStoreSettings
from llm_billing.metrics import BillingMetrics
from llm_billing.prices import load_prices
from llm_billing.server import build_billing, build_spec
from llm_billing.snapshot import export_snapshot
from llm_cache import config as cache_config
from llm_cache.envelope import new_key_line
from llm_cache.metrics import CacheMetrics
from llm_cache.server import CacheApp, load_encoder
from llm_cache.server import build_spec as cache_spec
from llm_common.redis_conn import open_client
from llm_common.resilience import BreakerMetrics
from llm_testing import running_server, settings_for_tests
from llm_testing.acl_redis import AclCluster, AclRedis
from llmapi.auth.v1 import auth_service_pb2 as auth_pb
from llmapi.auth.v1 import auth_service_pb2_grpc as auth_grpc
from llmapi.billing.v1 import billing_service_pb2 as bill_pb
from llmapi.billing.v1 import billing_service_pb2_grpc as bill_grpc
from llmapi.cache.v1 import cache_service_pb2 as cache_pb
from llmapi.cache.v1 import cache_service_pb2_grpc as cache_grpc
from llmapi.common.v1 import common_pb2

pytestmark = [pytest.mark.security, pytest.mark.integration]

# redis-py announces itself (CLIENT SETINFO) on every connection and ignores a refusal;
# CLIENT stays forbidden (it lists and kills other clients).
IGNORED = frozenset({"client"})
PRICES = """
currency: USD
prices:
  - model: small
    effective_from: "2020-01-01T00:00:00Z"
    input_micros_per_mtok: 150000
    cached_input_micros_per_mtok: 75000
    output_micros_per_mtok: 600000
"""


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclRedis]:
    server = AclRedis(tmp_path_factory.mktemp("acl-redis"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def acl_cluster() -> Iterator[AclCluster]:
    cluster = AclCluster()
    yield cluster
    cluster.stop()


@pytest.fixture
def fresh(acl_redis: AclRedis) -> AclRedis:
    acl_redis.reset_denials()
    return acl_redis


@pytest.fixture(params=["single", "cluster"])
def served_by(request: pytest.FixtureRequest, acl_redis: AclRedis) -> AclRedis | AclCluster:
    """Each service's operations on one node and on a Redis Cluster (slot discovery,
    WAIT for a replica), both loading the same rules."""
    server: AclRedis | AclCluster = acl_redis
    if request.param == "cluster":
        server = request.getfixturevalue("acl_cluster")
    server.reset_denials()
    return server


def client_as(server: AclRedis, service: str) -> redis.Redis:
    return redis.Redis.from_url(server.url_for(service), decode_responses=True)


def test_the_default_user_is_refused(fresh: AclRedis) -> None:
    with redis.Redis(port=fresh.port) as anonymous, pytest.raises(AuthenticationError):
        anonymous.ping()
    with redis.Redis(port=fresh.port, password="") as empty, pytest.raises(AuthenticationError):
        empty.ping()
    wrong = redis.Redis(port=fresh.port, username="cache", password="not-the-password")
    with wrong, pytest.raises(AuthenticationError):
        wrong.ping()


@pytest.mark.parametrize(
    ("intruder", "victim_key"),
    [
        ("cache", "auth:key:{k1}"),  # API key records
        ("billing", "llmcache:{t1}:e:1"),  # cached responses
        ("auth", "billing:{victim}:spent"),  # the ledger
        ("cache", "billing:{victim}:budget"),
    ],
)
def test_another_service_s_keys_are_refused(
    fresh: AclRedis, intruder: str, victim_key: str
) -> None:
    with fresh.inspector() as admin:
        admin.hset(victim_key, "f", "v")
    with client_as(fresh, intruder) as client:
        for command in (("HGETALL",), ("HSET", "f", "forged"), ("DEL",)):
            with pytest.raises(NoPermissionError):
                client.execute_command(command[0], victim_key, *command[1:])
        # A script runs with its caller's rights: no way around the key patterns.
        with pytest.raises(ResponseError, match="access"):
            client.eval("return redis.call('HGETALL', KEYS[1])", 1, victim_key)
        with pytest.raises(ResponseError, match="access"):  # the key hidden in ARGV
            client.eval("return redis.call('HGETALL', ARGV[1])", 0, victim_key)
    with fresh.inspector() as admin:
        assert admin.hget(victim_key, "f") == "v"


def test_only_auth_hears_and_announces_revocations(fresh: AclRedis) -> None:
    for intruder in ("cache", "billing"):
        with client_as(fresh, intruder) as client, pytest.raises(NoPermissionError):
            client.publish("auth:key-events", "k1")
    with client_as(fresh, "auth") as client:
        assert client.publish("auth:key-events", "k1") == 0
        with pytest.raises(NoPermissionError):
            client.publish("other:channel", "x")


@pytest.mark.parametrize("service", ["auth", "cache", "billing"])
@pytest.mark.parametrize(
    "command",
    [
        ("FLUSHALL",), ("FLUSHDB",), ("CONFIG", "GET", "*"), ("KEYS", "*"),
        ("DEBUG", "SLEEP", "0"), ("SHUTDOWN", "NOSAVE"), ("ACL", "LIST"), ("MODULE", "LIST"),
        ("CLIENT", "LIST"), ("INFO",), ("SCRIPT", "FLUSH"), ("MONITOR",), ("SWAPDB", "0", "1"),
    ],
    ids=lambda c: " ".join(c) if isinstance(c, tuple) else c,
)  # fmt: skip
def test_administrative_commands_are_refused(
    fresh: AclRedis, service: str, command: tuple[str, ...]
) -> None:
    with client_as(fresh, service) as client, pytest.raises(NoPermissionError):
        client.execute_command(*command)


async def test_auth_works_with_its_own_user(served_by: AclRedis | AclCluster) -> None:
    fresh = served_by
    settings = make_settings(fresh.url_for("auth"), "auth:")
    wait = int(isinstance(fresh, AclCluster))  # key writes wait for a replica on a cluster
    settings = replace(settings, redis=replace(settings.redis, wait_replicas=wait))
    async with serving(settings) as auth:
        await asyncio.wait_for(auth.app.key_events.subscribed.wait(), 10)
        stub = auth_grpc.AuthServiceStub(auth.channel)
        limits = KeyLimits(requests_per_minute=100, tokens_per_minute=1000, max_concurrent=2)
        record, key = await auth.create_key("acme", limits=limits)
        await stub.Authenticate(auth_pb.AuthenticateRequest(credential=key.text))
        page = await auth.app.keys.list("acme", offset=0, page_size=10, include_revoked=False)
        assert record.key_id in [k.key_id for k in page.records]
        base: dict[str, Any] = {"tenant_id": "acme", "key_id": record.key_id}
        await stub.ReserveTokens(auth_pb.ReserveTokensRequest(**base, tokens=5, reservation_id="r"))
        await stub.RefundTokens(auth_pb.RefundTokensRequest(**base, reservation_id="r", tokens=5))
        await stub.AcquireConcurrency(auth_pb.AcquireConcurrencyRequest(**base, lease_id="l1"))
        await stub.ReleaseConcurrency(auth_pb.ReleaseConcurrencyRequest(**base, lease_id="l1"))
        assert await auth.app.keys.rotate(record.key_id, grace_ms=0, now_ms=1) is not None
        await auth.app.keys.revoke(record.key_id, now_ms=1)
        assert await auth.app.keys.forget_tenant("acme") == 1  # tenant erasure
    assert fresh.denials(IGNORED) == []


async def test_cache_works_with_its_own_user(
    served_by: AclRedis | AclCluster, tmp_path: Path
) -> None:
    fresh = served_by
    master_keys = tmp_path / "cache-master.keys"  # encrypted at rest: data keys in Redis
    master_keys.write_text(new_key_line("k1") + "\n")
    master_keys.chmod(0o600)
    settings = cache_config.Settings(
        server=settings_for_tests("cache"),
        redis=cache_config.RedisSettings(url=fresh.url_for("cache"), timeout_s=2.0),
        semantic=cache_config.SemanticSettings(encoder_threads=1),
        encryption=cache_config.EncryptionSettings(master_key_file=master_keys),
    )
    app = CacheApp(
        settings,
        load_encoder(settings.semantic),
        metrics=CacheMetrics(CollectorRegistry()),
        breaker_metrics=BreakerMetrics(CollectorRegistry()),
    )
    async with running_server(cache_spec(app), settings=settings.server) as server:
        if app.sync is not None:
            await asyncio.wait_for(app.sync.ready.wait(), 10)
        stub = cache_grpc.CacheServiceStub(server.channel)
        key = cache_pb.CacheKey(
            tenant_id="acme",
            model="demo-llama",
            sampling=common_pb2.SamplingParams(temperature=0.0),
            messages=[
                common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content="Capital of France?")
            ],
        )
        answer = cache_pb.CachedResponse(
            text="Paris.",
            token_ids=[10, 11],
            finish_reason=common_pb2.FINISH_REASON_STOP,
            usage=common_pb2.Usage(prompt_tokens=12, completion_tokens=2, total_tokens=14),
        )
        stored = await stub.Store(cache_pb.StoreRequest(key=key, response=answer))
        assert stored.stored, (stored, fresh.denials(IGNORED))
        hit = await stub.Lookup(cache_pb.LookupRequest(key=key))
        assert hit.response.text == "Paris."
        stats = await stub.Stats(cache_pb.StatsRequest(tenant_id="acme"))
        assert stats.entries == 1
        await stub.Invalidate(cache_pb.InvalidateRequest(tenant_id="acme"))
        await stub.Store(cache_pb.StoreRequest(key=key, response=answer))
        gone = await stub.ForgetTenant(cache_pb.ForgetTenantRequest(tenant_id="acme"))
        assert gone.entries_removed == 1
    assert fresh.denials(IGNORED) == []


async def test_billing_works_with_its_own_user(
    served_by: AclRedis | AclCluster, tmp_path: Path
) -> None:
    fresh = served_by
    cluster = isinstance(fresh, AclCluster)
    prices_path = tmp_path / "prices.yaml"
    prices_path.write_text(PRICES, encoding="utf-8")
    settings = Settings(
        server=settings_for_tests("billing"),
        redis=RedisSettings(fresh.url_for("billing"), wait_replicas=int(cluster)),
        prices_config=prices_path,
        ledger=LedgerSettings(sweep_interval_s=0.2),
        usage_store=UsageStoreSettings(
            database_url=f"sqlite:///{tmp_path / 'usage.db'}", drain_interval_s=0.1
        ),
    )
    built = build_billing(
        settings, load_prices(prices_path, "USD"), metrics=BillingMetrics(CollectorRegistry())
    )
    async with running_server(build_spec(built), settings=settings.server) as server:
        stub = bill_grpc.BillingServiceStub(server.channel)
        request: dict[str, Any] = {
            "tenant_id": "acme",
            "key_id": "k1",
            "model": "small",
            "prompt_tokens": 10,
        }
        await stub.Reserve(
            bill_pb.ReserveRequest(request_id="r1", max_completion_tokens=5, **request)
        )
        await stub.Settle(
            bill_pb.SettleRequest(request_id="r1", prompt_tokens=10, completion_tokens=3)
        )
        await stub.Reserve(
            bill_pb.ReserveRequest(request_id="r2", max_completion_tokens=5, **request)
        )
        await stub.Release(bill_pb.ReleaseRequest(request_id="r2"))
        budget = bill_pb.Budget(
            tenant_id="acme", period=bill_pb.BUDGET_PERIOD_DAY, hard_limit_micros=10_000_000
        )
        await stub.SetBudget(bill_pb.SetBudgetRequest(budget=budget))
        await stub.GetBudget(bill_pb.GetBudgetRequest(tenant_id="acme"))
        now = int(time.time())
        window: dict[str, Any] = {
            "start_time": {"seconds": now - 3600},
            "end_time": {"seconds": now + 3600},
        }
        usage = await stub.GetUsage(bill_pb.GetUsageRequest(tenant_id="acme", **window))
        assert usage.total.requests == 1
        await asyncio.sleep(0.5)  # the sweeper and the outbox drain run at least once
        forgotten = await stub.ForgetTenant(bill_pb.ForgetTenantRequest(tenant_id="acme"))
        assert forgotten.ledger_records_deleted == 2
    client = open_client(fresh.url_for("billing"), timeout_s=2.0, decode_responses=True)
    try:
        assert await export_snapshot(client, "billing:", io.StringIO()) > 0
    finally:
        await client.aclose()
    assert fresh.denials(IGNORED) == []
