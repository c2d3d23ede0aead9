"""Key writes with AUTH_REDIS_WAIT_REPLICAS: acknowledged only once a replica has them (the
failover half is in tests/cluster); without one in time the caller gets UNAVAILABLE."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio
import redis.asyncio

from llm_auth.config import RedisSettings
from llm_auth.keyspace import Keyspace
from llm_auth.keystore import KeyStore, NewKey, key_wait
from llm_auth.redis_guard import RedisGuard, StoreUnavailable, connect
from llm_testing import PrivateRedis

pytestmark = pytest.mark.integration
PEPPER = b"p" * 32


@pytest_asyncio.fixture
async def lone_store(
    private_redis: Callable[..., PrivateRedis],
) -> AsyncIterator[tuple[KeyStore, redis.asyncio.Redis]]:
    """A store that waits for one replica, on a Redis that has none."""
    server = private_redis()
    settings = RedisSettings(url=server.url, prefix="dur:", wait_replicas=1, wait_timeout_ms=50)
    client = connect(settings)
    guard = RedisGuard(client, settings)
    store = KeyStore(guard, Keyspace("dur:"), PEPPER, wait=key_wait(settings))
    yield store, client
    await store.aclose()
    await client.aclose()


async def test_key_writes_wait_for_a_replica(
    lone_store: tuple[KeyStore, redis.asyncio.Redis],
) -> None:
    store, client = lone_store
    with pytest.raises(StoreUnavailable):  # WAIT 1 counted no replica within 50 ms
        await store.create(NewKey(tenant_id="t1", name="k"), now_ms=1)
    # The writes did run (WAIT is no rollback); only the acknowledgement was refused.
    assert await client.zcard(Keyspace("dur:").tenant_keys("t1")) == 1
    assert len(await client.keys("dur:key:*")) == 1


def test_waiting_is_on_by_default_only_on_a_cluster() -> None:
    single = RedisSettings.from_env({"REDIS_URL": "redis://127.0.0.1:6379/0"})
    cluster = RedisSettings.from_env({"REDIS_CLUSTER_NODES": "127.0.0.1:7000,127.0.0.1:7001"})
    assert key_wait(single) is None
    wait = key_wait(cluster)
    assert wait is not None
    assert (wait.replicas, wait.timeout_ms) == (1, 250)
