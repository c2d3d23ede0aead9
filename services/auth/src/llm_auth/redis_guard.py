"""One Redis client behind a circuit breaker: outages surface as StoreUnavailable, fast."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import ParamSpec, TypeVar

import redis.asyncio
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import (
    ClusterDownError,
    DataError,
    RedisClusterException,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from llm_auth.config import RedisSettings
from llm_common.redis_conn import cluster_client, is_cluster_url
from llm_common.resilience import AsyncBreaker, BreakerMetrics, BreakerOpen

P = ParamSpec("P")
T = TypeVar("T")
# Only these mean "Redis is not there"; a script error is a bug and must stay loud.
_OUTAGES = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
    # A Redis Cluster in the middle of a failover: no owner for a slot yet.
    ClusterDownError,
    TryAgainError,
    RedisClusterException,
)
POOL_WAIT_S = 1.0  # longest wait for a free connection when all are busy


class StoreUnavailable(Exception):  # noqa: N818 - reads as a state
    """Redis could not be reached (or the breaker is open); the operation did not happen."""


def connect(settings: RedisSettings) -> redis.asyncio.Redis:
    """A client that fails within `timeout_s` instead of retrying (the breaker and the callers'
    fallbacks decide what happens next), on a bounded pool: a burst of requests waits for a
    connection instead of opening thousands. A `redis+cluster://` URL: a RedisCluster."""
    if is_cluster_url(settings.url):
        return cluster_client(
            settings.url,
            timeout_s=settings.timeout_s,
            max_connections=settings.max_connections,
            retries=1,
        )
    pool = redis.asyncio.BlockingConnectionPool.from_url(
        settings.url,
        max_connections=settings.max_connections,
        timeout=POOL_WAIT_S,
        socket_timeout=settings.timeout_s,
        socket_connect_timeout=settings.timeout_s,
        retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False,
    )
    client: redis.asyncio.Redis = redis.asyncio.Redis.from_pool(pool)
    return client


class RedisGuard:
    """Runs Redis calls through an AsyncBreaker named `auth-redis`."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        settings: RedisSettings,
        breaker_metrics: BreakerMetrics | None = None,
    ) -> None:
        self.client = client
        self._breaker = AsyncBreaker(
            "auth-redis",
            fail_max=settings.breaker_fail_max,
            reset_timeout_s=settings.breaker_reset_s,
            exclude=(ResponseError, DataError),
            metrics=breaker_metrics,
        )

    async def run(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Await `fn(*args, **kwargs)`; StoreUnavailable when Redis is down or the breaker open."""
        try:
            return await self._breaker.call(self._translated, fn, *args, **kwargs)
        except BreakerOpen:
            raise StoreUnavailable("redis breaker is open") from None

    @staticmethod
    async def _translated(fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await fn(*args, **kwargs)
        except _OUTAGES as exc:
            raise StoreUnavailable(f"redis unavailable: {type(exc).__name__}") from exc
