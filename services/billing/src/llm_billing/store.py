"""The Redis client of the ledger and the mapping of Redis outages to UNAVAILABLE."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis.asyncio
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff

from llm_billing.config import RedisSettings
from llm_common.errors import Unavailable
from llm_common.logging import get_logger
from llm_common.redis_conn import cluster_client, is_cluster_url
from llm_common.redis_mux import ReplicaWait

RETRY_AFTER_S = 1.0
# Failures that say "the store is not there right now", not "this request is wrong".
STORE_UNAVAILABLE: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.BusyLoadingError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.TryAgainError,
)
_log = get_logger(__name__)


def make_client(settings: RedisSettings) -> redis.asyncio.Redis:
    """A client with a bounded pool: callers wait (up to the timeout) for a free connection.

    A command that finds its connection broken (e.g. Redis restarted) is retried on a fresh
    one; that is safe because every ledger operation is idempotent. A `redis+cluster://`
    URL: a RedisCluster (it follows MOVED/ASK and failovers)."""
    if is_cluster_url(settings.url):
        return cluster_client(
            settings.url,
            timeout_s=settings.timeout_s,
            max_connections=settings.max_connections,
            decode_responses=True,
        )
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        settings.url,
        max_connections=settings.max_connections,
        timeout=settings.timeout_s,
        socket_timeout=settings.timeout_s,
        socket_connect_timeout=settings.timeout_s,
        decode_responses=True,
        health_check_interval=30,
        retry=Retry(
            ExponentialWithJitterBackoff(base=0.05, cap=0.5),
            retries=2,
            supported_errors=(redis.exceptions.ConnectionError,),
        ),
    )
    return redis.asyncio.Redis(connection_pool=pool)


def replica_wait(settings: RedisSettings) -> ReplicaWait | None:
    """The WAIT Reserve/Settle make (BILLING_WAIT_REPLICAS, BILLING_WAIT_TIMEOUT_MS)."""
    if settings.wait_replicas <= 0:
        return None
    return ReplicaWait(settings.wait_replicas, settings.wait_timeout_ms)


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds (usage is bucketed by UTC wall time)."""
    return time.time_ns() // 1_000_000


@asynccontextmanager
async def store_errors() -> AsyncIterator[None]:
    """Turn a Redis outage into Unavailable with RetryInfo (every ledger call is idempotent,
    so the caller may simply retry)."""
    try:
        yield
    except STORE_UNAVAILABLE as exc:
        _log.warning("ledger store unavailable", error=type(exc).__name__)
        raise Unavailable("billing ledger unavailable", retry_after_s=RETRY_AFTER_S) from exc
