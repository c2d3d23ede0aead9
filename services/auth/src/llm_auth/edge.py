"""The lean listener for Envoy's per-request calls: ext_authz Check and ShouldRateLimit.

Envoy calls these on every edge request, and the latency they add is the product. This server
has no interceptors: Envoy already traces and logs each call on its side, and a span, an access
log line and context variables per call cost more than auth's own work on a cache hit. Each
call is still counted in the `llm_rpc_*` metrics, a ServiceError still becomes its rich status,
and anything unexpected becomes a generic INTERNAL with the cause logged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from envoy.service.auth.v3 import external_auth_pb2 as authz_pb
from envoy.service.ratelimit.v3 import rls_pb2
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from llm_auth.extauthz import AuthorizationServicer
from llm_auth.ratelimit_service import RateLimitServicer
from llm_common.config import ServerSettings
from llm_common.errors import ServiceError
from llm_common.interceptors import decoding_guarded, refuse_undecodable
from llm_common.logging import get_logger
from llm_common.metrics import RpcMetrics, default_rpc_metrics
from llm_common.server import server_options

AUTHZ_SERVICE = authz_pb.DESCRIPTOR.services_by_name["Authorization"].full_name
RLS_SERVICE = rls_pb2.DESCRIPTOR.services_by_name["RateLimitService"].full_name
INTERNAL_MESSAGE = "internal error"
Context = grpc.aio.ServicerContext[Any, Any]
Behavior = Callable[[Any, Context], Awaitable[Any]]
_log = get_logger(__name__)


def envoy_handlers(
    authz: AuthorizationServicer, rls: RateLimitServicer
) -> dict[str, dict[str, grpc.RpcMethodHandler[Any, Any]]]:
    """Service name -> method handlers, for Check and ShouldRateLimit."""
    should_rate_limit = grpc.unary_unary_rpc_method_handler(
        rls.ShouldRateLimit,
        request_deserializer=rls_pb2.RateLimitRequest.FromString,
        response_serializer=rls_pb2.RateLimitResponse.SerializeToString,
    )
    return {
        AUTHZ_SERVICE: authz.method_handlers(),
        RLS_SERVICE: {"ShouldRateLimit": should_rate_limit},
    }


def add_handlers(
    server: grpc.aio.Server, services: Mapping[str, dict[str, grpc.RpcMethodHandler[Any, Any]]]
) -> None:
    """Register as generated code does: generic (seen by interceptors) and pre-registered."""
    for name, handlers in services.items():
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
        server.add_registered_method_handlers(name, handlers)


def add_envoy_services(
    server: grpc.aio.Server, authz: AuthorizationServicer, rls: RateLimitServicer
) -> None:
    """Envoy's Authorization (ext_authz) and RateLimitService on `server`."""
    add_handlers(server, envoy_handlers(authz, rls))


def metered(behavior: Behavior, service: str, method: str, metrics: RpcMetrics) -> Behavior:
    """`behavior` with llm_rpc_* metrics and error mapping, and nothing else."""

    async def call(request: Any, context: Context) -> Any:
        metrics.started(service, method)
        start = time.perf_counter()

        def finished(code: str) -> None:
            # Recorded before a status is sent: the caller may read the metrics once it has it.
            metrics.finished(service, method, code, time.perf_counter() - start)

        try:
            refuse_undecodable(request)
            response = await behavior(request, context)
        except ServiceError as err:
            finished(err.code.name)
            await context.abort_with_status(err.to_status())
        except asyncio.CancelledError:
            finished("CANCELLED")
            raise
        except Exception:
            _log.exception("unhandled error in RPC handler", method=f"/{service}/{method}")
            finished("INTERNAL")
            await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)
        else:
            finished("OK")
            return response
        raise AssertionError("unreachable: abort raises")

    return call


def _metered_handler(
    handler: grpc.RpcMethodHandler[Any, Any], service: str, method: str, metrics: RpcMetrics
) -> grpc.RpcMethodHandler[Any, Any]:
    behavior: Any = handler.unary_unary  # the stubs type it as the sync signature
    if behavior is None:
        raise ValueError(f"/{service}/{method} is not unary-unary")
    return grpc.unary_unary_rpc_method_handler(
        metered(behavior, service, method, metrics),
        request_deserializer=decoding_guarded(handler.request_deserializer),
        response_serializer=handler.response_serializer,
    )


@dataclass(frozen=True, slots=True)
class EdgeServer:
    """The running lean listener."""

    server: grpc.aio.Server
    health: health.aio.HealthServicer
    port: int

    async def stop(self, grace_s: float) -> None:
        """NOT_SERVING first, so health-checking proxies stop choosing it, then drain."""
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)


async def start_edge_server(
    port: int,
    authz: AuthorizationServicer,
    rls: RateLimitServicer,
    settings: ServerSettings,
    *,
    host: str | None = None,
    metrics: RpcMetrics | None = None,
) -> EdgeServer:
    """Serve Check, ShouldRateLimit and grpc.health.v1 on `port` (0 picks a free one) without
    interceptors."""
    rpc_metrics = metrics or default_rpc_metrics()
    services = {
        service: {
            method: _metered_handler(handler, service, method, rpc_metrics)
            for method, handler in handlers.items()
        }
        for service, handlers in envoy_handlers(authz, rls).items()
    }
    server = grpc.aio.server(options=server_options(settings))
    add_handlers(server, services)
    # A proxy cluster pointing here can health-check it like the main port.
    probes = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(probes, server)
    for name in ("", *services):
        await probes.set(name, health_pb2.HealthCheckResponse.SERVING)
    bound = server.add_insecure_port(settings.bind_target(port, host))
    await server.start()
    _log.info("serving Envoy's ext_authz and rate-limit calls", port=bound)
    return EdgeServer(server, probes, bound)
