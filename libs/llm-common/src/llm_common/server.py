"""Service bootstrap: build the grpc.aio server, run it with health, metrics, signals and grace."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry import trace

from llm_common.config import ServerSettings
from llm_common.faults import fault_interceptors
from llm_common.interceptors import CallInterceptor
from llm_common.logging import get_logger
from llm_common.metrics import RpcMetrics, serve_metrics
from llm_common.tracing import configure_tracing

Hook = Callable[[], Awaitable[None]]
# Told the grace period in seconds; returns once the service's own streams have ended.
DrainHook = Callable[[float], Awaitable[None]]
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
_log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """What a service plugs into the generic server."""

    service_names: Sequence[str]  # full names, e.g. "llmapi.router.v1.RouterService"
    register: Callable[[grpc.aio.Server], None]  # adds the servicers
    on_start: Hook | None = None  # open downstream channels / Redis; health waits for it
    on_stop: Hook | None = None  # close them, after the server has drained
    # Shutdown began (health is NOT_SERVING): refuse new work, finish or hand off the running
    # work within the grace period and end long-lived streams; the listener closes after.
    on_drain: DrainHook | None = None
    interceptors: Sequence[grpc.aio.ServerInterceptor] = field(default=())  # run innermost
    # Full method names whose access log line is DEBUG (hot paths such as ext_authz Check).
    quiet_methods: frozenset[str] = frozenset()
    # Full method names whose successful calls the service logs itself: their line is DEBUG.
    logged_methods: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class BuiltServer:
    """A configured, not yet started server."""

    server: grpc.aio.Server
    health: health.aio.HealthServicer
    port: int


def server_options(settings: ServerSettings) -> list[tuple[str, Any]]:
    """Message limits, and keepalive tolerance matching `channels.make_channel` clients."""
    return [
        ("grpc.max_receive_message_length", settings.max_message_bytes),
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.max_ping_strikes", 2),
    ]


def default_interceptors(
    metrics: RpcMetrics | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    quiet_methods: frozenset[str] = frozenset(),
    logged_methods: frozenset[str] = frozenset(),
) -> list[grpc.aio.ServerInterceptor]:
    """The span, request id, deadline, access log, metrics and errors: one interceptor."""
    return [CallInterceptor(metrics, quiet_methods, tracer_provider, logged_methods)]


def build_server(
    settings: ServerSettings,
    spec: ServiceSpec,
    *,
    host: str | None = None,
    metrics: RpcMetrics | None = None,
    tracer_provider: trace.TracerProvider | None = None,
) -> BuiltServer:
    """Server with interceptors, the service, health and reflection, bound to its port.

    `host` defaults to `settings.bind_host` (BIND_HOST); `metrics` and `tracer_provider`
    default to the process-wide ones.
    """
    server = grpc.aio.server(
        interceptors=[
            *default_interceptors(
                metrics, tracer_provider, spec.quiet_methods, spec.logged_methods
            ),
            *spec.interceptors,
        ],
        options=server_options(settings),
    )
    spec.register(server)
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = (*spec.service_names, health.SERVICE_NAME, reflection.SERVICE_NAME)
    reflection.enable_server_reflection(names, server)
    target = settings.bind_target(settings.grpc_port, host)
    if settings.tls is None:
        port = server.add_insecure_port(target)
    else:  # only callers with a certificate from the mesh's CA (llm_common.server_tls)
        port = server.add_secure_port(target, settings.tls.credentials())
    return BuiltServer(server=server, health=health_servicer, port=port)


async def _set_health(built: BuiltServer, spec: ServiceSpec, status: Any) -> None:
    for name in ("", *spec.service_names):
        await built.health.set(name, status)


# grpc.aio's stop() has been seen to never return after the grace period; shutdown must end.
STOP_MARGIN_S = 5.0


async def _stop(built: BuiltServer, grace_s: float, on_drain: DrainHook | None = None) -> None:
    # Probes see NOT_SERVING first, so load balancers drain before the listener closes.
    await built.health.enter_graceful_shutdown()
    started = time.monotonic()
    if on_drain is not None:
        # The service drains while still reachable (health answers NOT_SERVING, its own
        # RPCs refuse new work politely); the listener closes once it is done.
        draining = asyncio.ensure_future(on_drain(grace_s))
        await asyncio.wait({draining}, timeout=grace_s)
        await _end_drain(draining)
    grace_s = max(grace_s - (time.monotonic() - started), 0.0)
    # asyncio.wait, not wait_for: wait_for waits for the cancelled task to finish, which never
    # happens if something inside it swallows the cancellation.
    stopping = asyncio.ensure_future(built.server.stop(grace_s))
    done, _ = await asyncio.wait({stopping}, timeout=grace_s + STOP_MARGIN_S)
    if not done:
        stopping.cancel()
        _log.warning("server stop overran its grace period; giving up on it", grace_s=grace_s)


async def _end_drain(draining: asyncio.Future[None]) -> None:
    """Cancel a drain that outlived the grace period; log a failed one."""
    if not draining.done():
        draining.cancel()
    await asyncio.wait({draining})
    if not draining.cancelled() and draining.exception() is not None:
        _log.warning("drain hook failed", error=repr(draining.exception()))


@contextlib.asynccontextmanager
async def running(
    settings: ServerSettings,
    spec: ServiceSpec,
    *,
    host: str | None = None,
    metrics: RpcMetrics | None = None,
    tracer_provider: trace.TracerProvider | None = None,
) -> AsyncIterator[BuiltServer]:
    """Start the server (NOT_SERVING until `on_start` is done), stop it gracefully on exit."""
    built = build_server(
        settings, spec, host=host, metrics=metrics, tracer_provider=tracer_provider
    )
    await _set_health(built, spec, NOT_SERVING)
    await built.server.start()
    started = False
    try:
        if spec.on_start is not None:
            await spec.on_start()
        started = True
        await _set_health(built, spec, SERVING)
        yield built
    finally:
        await _stop(built, settings.shutdown_grace_s, spec.on_drain)
        if started and spec.on_stop is not None:
            await spec.on_stop()


@contextlib.contextmanager
def _stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


async def serve(
    settings: ServerSettings,
    spec: ServiceSpec,
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[BuiltServer], None] | None = None,
) -> None:
    """Run the service until SIGTERM/SIGINT (or `stop` is set), then drain and return.

    `ready` is called once the server is SERVING (tests use it to learn the port).
    """
    faults = fault_interceptors(os.environ)  # off unless LLM_FAULTS is set (chaos tests)
    if faults:
        spec = dataclasses.replace(spec, interceptors=(*spec.interceptors, *faults))
    provider = configure_tracing(settings.service_name, settings.otlp_endpoint)
    endpoint = None
    if settings.metrics_port is not None:
        endpoint = serve_metrics(settings.metrics_port, addr=settings.bind_address or "0.0.0.0")
    stop = stop if stop is not None else asyncio.Event()
    try:
        with _stop_on_signals(stop):
            async with running(settings, spec) as built:
                metrics_port = endpoint.port if endpoint is not None else None
                _log.info("serving", port=built.port, metrics_port=metrics_port)
                # What start-up allocated lives as long as the process: out of the cyclic
                # GC's reach, full collections stop walking it in the middle of requests.
                gc.freeze()
                if ready is not None:
                    ready(built)
                await stop.wait()
                _log.info("shutting down", grace_s=settings.shutdown_grace_s)
    finally:
        if endpoint is not None:
            endpoint.close()
        provider.shutdown()
