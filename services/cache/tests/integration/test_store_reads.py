"""RedisStore's lookup reads, which travel on llm_common's RedisMux (or, where it cannot go,
the pool): binary responses come back intact, flushed scripts are reloaded, a hung Redis
fails within the configured timeout, and a lost Redis leaves no stale pooled connection."""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

from llm_cache.config import Policy, RedisSettings
from llm_cache.server import redis_client
from llm_cache.store import NewEntry, RedisStore, StoreUnavailable
from llm_common.redis_mux import PoolPipeline
from llm_common.resilience import AsyncBreaker, BreakerMetrics

pytestmark = pytest.mark.integration

TENANT = "tenant-a"
ENTRY_ID = "0123456789abcdef0123456789abcdef"
RESPONSE = bytes(range(256)) * 4  # not UTF-8: a serialized proto may hold any byte
CREATED_MS = 1_700_000_000_123


@dataclass(frozen=True, slots=True)
class Opened:
    store: RedisStore
    client: redis.asyncio.Redis
    breaker: AsyncBreaker


@asynccontextmanager
async def opened(
    url: str, prefix: str, *, pool_only: bool = False, timeout_s: float = 1.0
) -> AsyncIterator[Opened]:
    """A RedisStore as the service builds it (reads on RedisMux), or with reads on the pool
    (what it falls back to for TLS)."""
    settings = RedisSettings(url=url, key_prefix=prefix, timeout_s=timeout_s)
    client = redis_client(settings)
    breaker = AsyncBreaker("test", fail_max=100, metrics=BreakerMetrics(CollectorRegistry()))
    hot = PoolPipeline(client) if pool_only else None
    store = RedisStore(client, settings, Policy(), breaker, hot=hot)
    try:
        yield Opened(store, client, breaker)
    finally:
        await store.aclose()
        await client.aclose()


def entry(vector: bytes | None = None) -> NewEntry:
    return NewEntry(
        entry_id=ENTRY_ID,
        model="m",
        namespace="ns",
        response=RESPONSE,
        created_ms=CREATED_MS,
        ttl_s=600,
        vector=vector,
        semantic_text="text" if vector is not None else None,
    )


@pytest.mark.parametrize("pool_only", [False, True], ids=["mux", "pool"])
async def test_reads_return_the_stored_bytes(
    redis_url: str, redis_prefix: str, pool_only: bool
) -> None:
    async with opened(redis_url, redis_prefix, pool_only=pool_only) as o:
        store = o.store
        await store.put(TENANT, entry(vector=b"\x00" * 16))

        hit = await store.get_exact(TENANT, ENTRY_ID)
        assert hit is not None
        assert (hit.entry_id, hit.response, hit.created_ms) == (ENTRY_ID, RESPONSE, CREATED_MS)
        assert await store.get_exact(TENANT, "f" * 32) is None

        fetch = await store.get_semantic(TENANT, "query", ["e" * 32, ENTRY_ID])
        assert fetch.hit is not None
        assert (fetch.hit.entry_id, fetch.hit.response) == (ENTRY_ID, RESPONSE)
        assert fetch.missing == ("e" * 32,)


async def test_reads_reload_scripts_that_redis_lost(private_redis: Callable[..., Any]) -> None:
    server = private_redis()
    async with opened(server.url, "t:") as o:
        await o.store.put(TENANT, entry())
        assert await o.store.get_exact(TENANT, ENTRY_ID) is not None
        await o.client.script_flush()  # what a restart or SCRIPT FLUSH leaves

        hit = await o.store.get_exact(TENANT, ENTRY_ID)
        assert hit is not None
        assert hit.response == RESPONSE
        assert o.breaker.fail_counter == 0  # NOSCRIPT is not a failure of Redis


async def test_a_hung_redis_fails_a_read_within_the_timeout(
    private_redis: Callable[..., Any],
) -> None:
    server = private_redis()
    timeout_s = 0.5  # the mux's own watchdog looks only every timeout_s / 2
    async with opened(server.url, "t:", timeout_s=timeout_s) as o:
        store = o.store
        await store.put(TENANT, entry())
        assert await store.get_exact(TENANT, ENTRY_ID) is not None
        server.process.send_signal(signal.SIGSTOP)
        try:
            started = time.perf_counter()
            with pytest.raises(StoreUnavailable) as caught:
                await store.get_exact(TENANT, ENTRY_ID)
            elapsed = time.perf_counter() - started
        finally:
            server.process.send_signal(signal.SIGCONT)
        assert timeout_s - 0.01 <= elapsed < timeout_s + 0.2
        # The read's own deadline, not the watchdog's (redis.exceptions.TimeoutError).
        assert type(caught.value.__cause__) is TimeoutError
        # The mux's watchdog may still close the connection that went silent (failing the
        # read then in flight); by the second read, lookups are served again.
        with contextlib.suppress(StoreUnavailable):
            await store.get_exact(TENANT, ENTRY_ID)
        assert await store.get_exact(TENANT, ENTRY_ID) is not None


async def test_a_lost_redis_leaves_no_stale_pooled_connection(
    private_redis: Callable[..., Any],
) -> None:
    server = private_redis()
    async with opened(server.url, "t:") as o:
        store = o.store
        await store.put(TENANT, entry())  # leaves an idle connection in the pool
        server.stop()
        with pytest.raises(StoreUnavailable):
            await store.get_exact(TENANT, ENTRY_ID)  # the mux finds Redis gone
        server.start()  # same port, empty

        # The pooled write does not meet the connection Redis closed while it was down.
        await store.put(TENANT, entry())
        assert await store.get_exact(TENANT, ENTRY_ID) is not None
