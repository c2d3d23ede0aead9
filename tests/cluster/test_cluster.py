"""On a real local Redis Cluster: every tenant's keys of auth, cache and billing share one
slot, tenants spread over all masters, and a master killed under load loses nothing that
billing acknowledged."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
from redis.crc import key_slot

from llm_auth.config import RedisSettings as AuthRedisSettings
from llm_auth.keyspace import Keyspace
from llm_auth.keystore import KeyStore, NewKey, key_wait
from llm_auth.redis_guard import RedisGuard, StoreUnavailable, connect
from llm_billing.keys import KeySpace
from llm_common.redis_cluster_mux import ClusterMux
from llm_common.redis_conn import cluster_client, redis_url_from_env
from llm_common.redis_mux import ReplicaWait, pipelined
from llm_testing.redis_cluster_local import LocalCluster
from llm_testing.tls_certs import make_certificates

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
TENANTS = [f"tenant-{i}" for i in range(600)]


def _failover_module() -> ModuleType:
    """bench/cluster_failover.py (shared with `make bench-cluster`)."""
    return _bench_module("cluster_failover")


def _bench_module(name: str) -> ModuleType:
    """bench/<name>.py: the scenarios `make bench-cluster` runs too."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def cluster() -> Iterator[LocalCluster]:
    """A private cluster: these tests kill its nodes."""
    with LocalCluster() as local:
        yield local


def _owner_ports(cluster: LocalCluster) -> dict[int, int]:
    """slot -> port of the master that owns it."""
    owners: dict[int, int] = {}
    slots = cluster.client(cluster.ports[0]).execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
    for start, end, master, *_ in slots:
        for slot in range(int(start), int(end) + 1):
            owners[slot] = int(master[1])
    return owners


def test_every_tenant_is_one_slot_and_tenants_spread_over_every_master(
    cluster: LocalCluster,
) -> None:
    owners = _owner_ports(cluster)
    auth, billing = Keyspace("auth:"), KeySpace("billing:")
    per_master: Counter[int] = Counter()
    for tenant in TENANTS:
        keys = [
            auth.bucket(tenant, "req:key:k1"),
            auth.reservation(tenant, "r1"),
            auth.leases(tenant, "k1"),
            auth.tenant_keys(tenant),
            billing.record(tenant, "rid"),
            billing.balance(tenant, "k1", "d:1"),
            billing.usage_outbox(tenant),
            billing.open_reservations(tenant),
        ]
        slots = {key_slot(k.encode()) for k in keys}
        assert len(slots) == 1, (tenant, slots)  # every script of a tenant touches one slot
        per_master[owners[slots.pop()]] += 1
    masters = cluster.master_ports()
    assert set(per_master) == set(masters)
    share = {port: count / len(TENANTS) for port, count in per_master.items()}
    assert all(0.25 <= s <= 0.42 for s in share.values()), share


def test_failover_under_load_loses_nothing_acknowledged(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    failover = _failover_module()
    result = asyncio.run(failover.run_failover(cluster, tmp_path, duration_s=10.0))
    assert result.billing_pairs_acked > 1000
    assert result.ledger_micros == result.client_micros  # WAIT 1: nothing acked was lost
    assert result.recovery_s <= 10.0, result.notes
    # At most one bucket more than exact (the bucket's last writes may die with the master).
    assert result.limiter_admitted <= result.limiter_exact + failover.LIMIT_PER_MIN


def test_failover_through_the_edge_loses_no_chat_and_no_token(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    scenario = _bench_module("cluster_edge_failover")
    stack = scenario.start_stack(ROOT, cluster, tmp_path / "stack")
    endpoints = stack.start()
    try:
        result = scenario.run_edge_failover(stack, endpoints, cluster)
    finally:
        stack.stop()
    assert result.chats_answered > 50, result
    assert result.recovery_s <= 10.0, result
    # Every answered chat billed once, with exactly the tokens its client was told about.
    assert result.billed_requests == result.chats_answered, result
    assert result.billed_tokens == result.client_tokens, result


def test_acknowledged_revocations_survive_their_master_dying(cluster: LocalCluster) -> None:
    asyncio.run(_revoke_then_kill(cluster))


async def _revoke_then_kill(cluster: LocalCluster) -> None:
    """Keys revoked with AUTH_REDIS_WAIT_REPLICAS=1, then a master SIGKILLed at once: every
    revocation that was acknowledged is still there on the promoted replica."""
    settings = AuthRedisSettings(
        url=cluster.url, prefix="rv:", timeout_s=1.0, wait_replicas=1, wait_timeout_ms=500
    )
    client = connect(settings)
    guard = RedisGuard(client, settings)
    store = KeyStore(guard, Keyspace("rv:"), b"p" * 32, wait=key_wait(settings))
    try:
        records = [(await store.create(NewKey(tenant_id=f"rv{i}"), 1))[0] for i in range(24)]
        for record in records:
            assert await store.revoke(record.key_id, 2) is not None  # acknowledged
        cluster.kill_master()
        deadline = time.monotonic() + 20
        for record in records:
            while True:
                try:
                    stored = await store.get(record.key_id)
                    break
                except StoreUnavailable:
                    assert time.monotonic() < deadline, "the cluster did not recover"
                    await asyncio.sleep(0.2)
            assert stored is not None
            assert stored.is_revoked()
    finally:
        await store.aclose()
        await client.aclose()


def test_a_tls_cluster_takes_the_mux_and_its_writes_wait_for_replicas(tmp_path: Path) -> None:
    try:
        cluster = LocalCluster(tls=make_certificates(tmp_path / "tls")).start()
    except (RuntimeError, subprocess.CalledProcessError):
        pytest.skip("this redis-server has no TLS")
    try:
        assert cluster.tls is not None
        environ = {"REDIS_CLUSTER_NODES": "rediss://" + cluster.nodes}
        url = redis_url_from_env(environ | {"REDIS_TLS_CA_CERT": str(cluster.tls.ca)}, None)
        asyncio.run(_waited_writes_over_tls(url))
    finally:
        cluster.stop()


async def _waited_writes_over_tls(url: str) -> None:
    client = cluster_client(url, timeout_s=2.0)
    hot = pipelined(client)
    try:
        assert isinstance(hot, ClusterMux)  # not redis-py's pipeline, where WAIT goes astray
        keys = [f"tls:{{t{i}}}" for i in range(12)]  # over every master
        replies = await hot.execute([["SET", k, "v"] for k in keys], wait=ReplicaWait(1, 2000))
        assert replies == ["OK"] * len(keys)  # each master's WAIT counted its replica
        assert await client.get(keys[0]) == b"v"
    finally:
        await hot.aclose()
        await client.aclose()
