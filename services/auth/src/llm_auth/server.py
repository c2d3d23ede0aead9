"""Wiring: Redis, key store, verifiers and limiter behind AuthService, ext_authz and the RLS."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import grpc
from envoy.service.auth.v3 import external_auth_pb2 as authz_pb
from envoy.service.ratelimit.v3 import rls_pb2

from llm_auth.admin import AdminGate
from llm_auth.authenticator import Authenticator, now_ms
from llm_auth.bootstrap import ensure_admin_key, ensure_admin_key_with_retry
from llm_auth.config import Settings
from llm_auth.edge import EdgeServer, add_envoy_services, start_edge_server
from llm_auth.extauthz import AuthorizationServicer, RequestRates
from llm_auth.failure_throttle import FailureThrottle
from llm_auth.http_authz import HttpAuthzServer, start_http_authz
from llm_auth.jwt_verify import JwtVerifier
from llm_auth.key_admin import KeyAdmin
from llm_auth.key_events import KeyEventSubscriber
from llm_auth.keyspace import Keyspace
from llm_auth.keystore import KeyStore, key_wait
from llm_auth.limiter import Limiter
from llm_auth.metrics import AuthMetrics, default_auth_metrics
from llm_auth.quotas import Quotas
from llm_auth.ratelimit_service import RateLimitServicer
from llm_auth.records import KeyRecord
from llm_auth.redis_guard import RedisGuard, StoreUnavailable, connect
from llm_auth.rls import RateLimitPolicy
from llm_auth.service import AuthServicer
from llm_auth.ttl_cache import TtlCache
from llm_common import server as common_server
from llm_common.metrics import RpcMetrics
from llm_common.redis_conn import is_cluster_url, verify_redis
from llm_common.resilience import BreakerMetrics
from llm_common.server import BuiltServer, ServiceSpec
from llmapi.auth.v1 import auth_service_pb2 as pb
from llmapi.auth.v1 import auth_service_pb2_grpc as pb_grpc

AUTH_SERVICE = pb.DESCRIPTOR.services_by_name["AuthService"].full_name
AUTHZ_SERVICE = authz_pb.DESCRIPTOR.services_by_name["Authorization"].full_name
RLS_SERVICE = rls_pb2.DESCRIPTOR.services_by_name["RateLimitService"].full_name
SERVICE_NAMES = (AUTH_SERVICE, AUTHZ_SERVICE, RLS_SERVICE)
# Envoy asks these on every edge request and its own access log records each one; the router
# calls the quota methods on every request and logs the request itself. Errors still log.
_ROUTER_QUOTA_METHODS = (
    "ReserveTokens",
    "RefundTokens",
    "AcquireConcurrency",
    "ReleaseConcurrency",
)
QUIET_METHODS = frozenset(
    {
        f"/{AUTHZ_SERVICE}/Check",
        f"/{RLS_SERVICE}/ShouldRateLimit",
        *(f"/{AUTH_SERVICE}/{m}" for m in _ROUTER_QUOTA_METHODS),
    }
)


class AuthApp:
    """The service's parts, built without I/O; `start` and `stop` bracket their use."""

    def __init__(
        self,
        settings: Settings,
        *,
        metrics: AuthMetrics | None = None,
        breaker_metrics: BreakerMetrics | None = None,
        rpc_metrics: RpcMetrics | None = None,
    ) -> None:
        self.settings = settings
        self._rpc_metrics = rpc_metrics  # of the edge listener; None = the process-wide ones
        self.metrics = metrics or default_auth_metrics()
        self.redis = connect(settings.redis)
        self.guard = RedisGuard(self.redis, settings.redis, breaker_metrics)
        keyspace = Keyspace(settings.redis.prefix)
        self.keys = KeyStore(self.guard, keyspace, settings.pepper, wait=key_wait(settings.redis))
        cache = TtlCache[str, KeyRecord](settings.key_cache_ttl_s, settings.key_cache_max_entries)
        jwt = JwtVerifier(settings.jwt, settings.limits) if settings.jwt.enabled else None
        self.authenticator = Authenticator(
            self.keys, settings.pepper, cache, self.metrics, jwt, fresh_s=settings.key_fresh_s
        )
        self.keys.on_change(self.authenticator.forget)
        self.key_events = KeyEventSubscriber(
            self.redis, keyspace.key_events(), self.authenticator.forget, self.authenticator.resync
        )
        self.limiter = Limiter(self.guard, keyspace)
        self.quotas = Quotas(
            self.limiter,
            self.authenticator,
            settings.limits,
            settings.rate_limit_failure_mode,
            self.metrics,
            settings.reservation_ttl_s,
        )
        rates = RequestRates(tenant_per_minute=settings.limits.tenant_requests_per_minute)
        self.authz = AuthorizationServicer(
            self.authenticator,
            settings.public_paths,
            self.metrics,
            rates,
            FailureThrottle(settings.failed_auth),
        )
        self.rls = RateLimitServicer(RateLimitPolicy(self.quotas))
        self.edge: EdgeServer | None = None
        self.http_authz: HttpAuthzServer | None = None
        self._bootstrap: asyncio.Task[None] | None = None

    def register(self, server: grpc.aio.Server) -> None:
        """Adds AuthService, Authorization and RateLimitService to `server`."""
        s = self.settings
        gate = AdminGate(self.authenticator, s.admin_tenant)
        servicer = AuthServicer(self.authenticator, gate, KeyAdmin(self.keys, gate), self.quotas, s)
        pb_grpc.add_AuthServiceServicer_to_server(servicer, server)
        add_envoy_services(server, self.authz, self.rls)

    async def start(self) -> None:
        """Stores the bootstrap admin key, then starts the edge listener (if configured; last,
        so a failed start leaves nothing running). If Redis is down, the bootstrap key is
        retried in the background: an outage must not keep the service from answering JWTs
        and cached keys. A Redis Cluster that is unreachable or not a cluster at start-up is
        a configuration error (one line naming REDIS_CLUSTER_NODES)."""
        if is_cluster_url(self.settings.redis.url):
            await verify_redis(self.redis, self.settings.redis.url)
        self.key_events.start()
        await self._store_bootstrap_key()
        if self.settings.edge_port is not None:
            self.edge = await start_edge_server(
                self.settings.edge_port,
                self.authz,
                self.rls,
                self.settings.server,
                metrics=self._rpc_metrics,
            )
        if self.settings.http_authz_port is not None:
            self.http_authz = await start_http_authz(
                self.settings.http_authz_port,
                self.authz,
                host=self.settings.server.bind_address,
                metrics=self._rpc_metrics,
            )

    async def _store_bootstrap_key(self) -> None:
        key = self.settings.bootstrap_admin_key
        if key is None:
            return
        s = self.settings
        try:
            await ensure_admin_key(self.keys, s.pepper, key, s.admin_tenant, now_ms())
        except StoreUnavailable:
            self._bootstrap = asyncio.create_task(
                ensure_admin_key_with_retry(self.keys, s.pepper, key, s.admin_tenant, now_ms),
                name="bootstrap-admin-key",
            )

    async def wait_bootstrapped(self) -> None:
        """Returns once the bootstrap key is stored (tests and health gates use it)."""
        if self._bootstrap is not None:
            await asyncio.shield(self._bootstrap)

    async def stop(self) -> None:
        if self._bootstrap is not None and not self._bootstrap.done():
            self._bootstrap.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._bootstrap
        if self.http_authz is not None:
            await self.http_authz.stop(self.settings.server.shutdown_grace_s)
        if self.edge is not None:
            await self.edge.stop(self.settings.server.shutdown_grace_s)
        await self.key_events.stop()
        await self.limiter.aclose()
        await self.keys.aclose()
        await self.redis.aclose()

    def spec(self) -> ServiceSpec:
        """The ServiceSpec for llm_common.server."""
        return ServiceSpec(
            service_names=SERVICE_NAMES,
            register=self.register,
            on_start=self.start,
            on_stop=self.stop,
            quiet_methods=QUIET_METHODS,
        )


async def serve(
    settings: Settings,
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[BuiltServer], None] | None = None,
) -> None:
    """Serve until SIGTERM/SIGINT (or `stop`)."""
    app = AuthApp(settings)
    await common_server.serve(settings.server, app.spec(), stop=stop, ready=ready)
