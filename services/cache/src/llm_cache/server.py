"""Wiring: Redis clients, the encoder and semantic engine, the change log with its
listeners (index sync, change feed), and CacheService on llm_common's server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import grpc
import redis.asyncio as aioredis
import torch
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from llm_cache.cache import ResponseCache
from llm_cache.changes import ChangeLog
from llm_cache.config import EncryptionSettings, RedisSettings, SemanticSettings, Settings
from llm_cache.datakeys import DataKeys, DataKeySettings
from llm_cache.encoder import Encoder, EncoderLoadError, default_model_dir, fast_dtype
from llm_cache.envelope import read_key_file
from llm_cache.feed import ChangeFeed
from llm_cache.index import VectorIndex
from llm_cache.metrics import CacheMetrics, default_cache_metrics
from llm_cache.sealing import EntrySealer
from llm_cache.semantic import SemanticEngine
from llm_cache.service import CacheServicer
from llm_cache.stats import Stats
from llm_cache.store import RedisStore
from llm_cache.sync import IndexSync
from llm_cache.verifier import Verifier, VerifierLoadError, default_verifier_dir
from llm_common import server as common_server
from llm_common.config import ConfigError
from llm_common.logging import get_logger
from llm_common.redis_conn import cluster_client, is_cluster_url, verify_redis
from llm_common.resilience import AsyncBreaker, BreakerMetrics
from llm_common.server import BuiltServer, ServiceSpec
from llmapi.cache.v1 import cache_service_pb2 as pb
from llmapi.cache.v1 import cache_service_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["CacheService"].full_name
# Called on every generation request, or every second by every router (RecordHits): no
# access line each (llm_rpc_* metrics count them, and an unexpected error is still logged
# with its traceback).
QUIET_METHODS = frozenset(f"/{SERVICE_NAME}/{m}" for m in ("Lookup", "Store", "RecordHits"))
BREAKER_NAME = "cache-redis"
_FOLLOW_TIMEOUT_S = 5.0  # the follower's XREAD blocks for 0.9 s
_log = get_logger(__name__)


def redis_client(settings: RedisSettings, *, timeout_s: float | None = None) -> aioredis.Redis:
    """A client that fails fast: short timeouts and no retries (the breaker decides)."""
    timeout = settings.timeout_s if timeout_s is None else timeout_s
    if is_cluster_url(settings.url):
        return cluster_client(settings.url, timeout_s=timeout, retries=1)
    return aioredis.Redis.from_url(
        settings.url,
        socket_timeout=timeout,
        socket_connect_timeout=settings.timeout_s,
        retry=Retry(NoBackoff(), 0),
    )


def load_sealer(
    settings: EncryptionSettings, client: aioredis.Redis, key_prefix: str
) -> EntrySealer | None:
    """The sealer over the master key file; None (and a warning) without one. ConfigError
    (naming CACHE_MASTER_KEY_FILE) when the file cannot be used."""
    if settings.master_key_file is None:
        _log.warning("CACHE_MASTER_KEY_FILE unset: cached prompts and responses are not encrypted")
        return None
    try:
        ring = read_key_file(settings.master_key_file)
    except (OSError, ValueError) as exc:
        raise ConfigError.for_variable("CACHE_MASTER_KEY_FILE", str(exc)) from exc
    held = DataKeySettings(cache_size=settings.dek_cache_size, ttl_s=settings.dek_cache_ttl_s)
    return EntrySealer(DataKeys(client, key_prefix, ring, held))


def load_encoder(settings: SemanticSettings) -> Encoder:
    """The configured encoder; ConfigError (naming CACHE_ENCODER_DIR) when it cannot load."""
    try:
        return Encoder(settings.model_dir or default_model_dir(), dtype=encoder_dtype(settings))
    except (EncoderLoadError, OSError, ImportError) as exc:
        raise ConfigError.for_variable("CACHE_ENCODER_DIR", str(exc)) from exc


def load_verifier(settings: SemanticSettings) -> Verifier | None:
    """The verifier when any tenant's mode uses it; ConfigError (naming
    CACHE_VERIFIER_DIR) when it cannot load or does not fit the encoder."""
    if not (settings.enabled and settings.verifier_needed):
        return None
    try:
        return Verifier(
            settings.verifier_dir or default_verifier_dir(),
            settings.model_dir or default_model_dir(),
            dtype=encoder_dtype(settings),
        )
    except (VerifierLoadError, EncoderLoadError, OSError, ImportError, ValueError) as exc:
        raise ConfigError.for_variable("CACHE_VERIFIER_DIR", str(exc)) from exc


def encoder_dtype(settings: SemanticSettings) -> torch.dtype:
    """The torch dtype CACHE_ENCODER_DTYPE names ("auto": what this CPU runs fastest)."""
    if settings.encoder_dtype == "auto":
        return fast_dtype()
    return torch.bfloat16 if settings.encoder_dtype == "bfloat16" else torch.float32


class CacheApp:
    """Owns everything with a lifetime: Redis clients, the semantic worker, the change log's
    follower and the index rebuild."""

    def __init__(
        self,
        settings: Settings,
        encoder: Encoder | None,
        *,
        metrics: CacheMetrics | None = None,
        breaker_metrics: BreakerMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or default_cache_metrics()
        self._client = redis_client(settings.redis)
        self._follower = redis_client(settings.redis, timeout_s=_FOLLOW_TIMEOUT_S)
        breaker = AsyncBreaker(
            BREAKER_NAME,
            fail_max=settings.redis.breaker_fail_max,
            reset_timeout_s=settings.redis.breaker_reset_s,
            metrics=breaker_metrics,
        )
        sealer = load_sealer(settings.encryption, self._client, settings.redis.key_prefix)
        self.store = RedisStore(
            self._client, settings.redis, settings.policy, breaker, sealer=sealer
        )
        self.engine = _engine(settings.semantic, encoder)
        self.changes = ChangeLog(
            self.store, self._follower, settings.redis.key_prefix, self.metrics
        )
        self.feed = ChangeFeed(settings.feed, self.metrics)
        self.changes.listen(self.feed)  # first: callers' copies matter more than the index
        self.sync: IndexSync | None = None
        if self.engine is not None:
            self.sync = IndexSync(self.store, self.engine, self.changes, self.metrics)
            self.changes.listen(self.sync)
        self.cache = ResponseCache(
            self.store,
            self.engine,
            self.changes,
            self.sync,
            semantic=settings.semantic,
            policy=settings.policy,
            stats=Stats(),
            metrics=self.metrics,
        )
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Start following the change log, and the semantic worker and index rebuild. Does
        not wait for Redis: the service serves (exact hits, misses) while the index warms
        up, and the change feed goes live once the log is read. A Redis Cluster that is
        unreachable or not a cluster at start-up is a configuration error (one line naming
        REDIS_CLUSTER_NODES)."""
        if is_cluster_url(self.settings.redis.url):
            await verify_redis(self._client, self.settings.redis.url)
        self._tasks.append(asyncio.create_task(self.changes.run(), name="change-log"))
        if self.engine is not None and self.sync is not None:
            self.engine.start()
            self._tasks.append(asyncio.create_task(self.sync.run(), name="index-rebuild"))

    def stopping(self) -> None:
        """The service is about to stop: end the change feed's streams now, so that the
        server's graceful stop does not wait its whole grace period for them."""
        self.feed.close()

    async def close(self) -> None:
        self.feed.close()
        self.changes.stop()
        if self._tasks:  # the change log's readers end within one blocking read
            await asyncio.wait(self._tasks[:1], timeout=_FOLLOW_TIMEOUT_S)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.engine is not None:
            await self.engine.close()
        await self.store.aclose()
        await self._client.aclose()
        await self._follower.aclose()


def _engine(settings: SemanticSettings, encoder: Encoder | None) -> SemanticEngine | None:
    if not settings.enabled or encoder is None:
        return None
    index = VectorIndex(
        encoder.dim,
        max_vectors=settings.max_vectors,
        prefilter_min_rows=settings.prefilter_min_rows,
        prefilter_keep=settings.prefilter_keep,
    )
    return SemanticEngine(
        encoder, index, max_batch=settings.max_batch, verifier=load_verifier(settings)
    )


def build_spec(app: CacheApp) -> ServiceSpec:
    """The ServiceSpec for llm_common.server: CacheService over `app`."""
    servicer = CacheServicer(app.cache, app.feed, app.settings.limits, app.settings.policy)

    def register(server: grpc.aio.Server) -> None:
        pb_grpc.add_CacheServiceServicer_to_server(servicer, server)

    return ServiceSpec(
        service_names=(SERVICE_NAME,),
        register=register,
        on_start=app.start,
        on_stop=app.close,
        quiet_methods=QUIET_METHODS,
    )


async def serve(
    settings: Settings,
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[BuiltServer], None] | None = None,
) -> None:
    """Load the encoder, then serve until SIGTERM/SIGINT (or `stop`)."""
    encoder = None
    if settings.semantic.enabled:
        torch.set_num_threads(settings.semantic.encoder_threads)
        encoder = await asyncio.to_thread(load_encoder, settings.semantic)
    app = CacheApp(settings, encoder)
    # The signal handlers set this event; ending the streams on it, before the server's
    # graceful stop begins, lets that stop finish as soon as unary calls have.
    stop = stop if stop is not None else asyncio.Event()
    watcher = asyncio.create_task(_call_when_set(stop, app.stopping), name="feed-stopper")
    try:
        await common_server.serve(settings.server, build_spec(app), stop=stop, ready=ready)
    finally:
        watcher.cancel()


async def _call_when_set(event: asyncio.Event, fn: Callable[[], None]) -> None:
    await event.wait()
    fn()
