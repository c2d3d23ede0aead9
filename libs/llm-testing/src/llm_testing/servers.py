"""In-process gRPC servers on a free port for tests: real servers, raw-bytes services."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health
from opentelemetry import trace

from llm_common.channels import make_channel
from llm_common.config import ServerSettings
from llm_common.metrics import RpcMetrics
from llm_common.server import Hook, ServiceSpec, running

if TYPE_CHECKING:
    pass

# A handler taking (request bytes, context): a coroutine, or an async generator for streams.
Behavior = Callable[[bytes, grpc.aio.ServicerContext[bytes, bytes]], Any]


@dataclass(frozen=True, slots=True)
class RunningServer:
    """A started test server and a channel (through `make_channel`) connected to it."""

    port: int
    channel: grpc.aio.Channel
    health: health.aio.HealthServicer
    server: grpc.aio.Server

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


def settings_for_tests(
    service_name: str = "test", *, shutdown_grace_s: float = 0.5
) -> ServerSettings:
    """Settings for an in-process server: ephemeral gRPC port, no metrics endpoint."""
    return ServerSettings(
        service_name=service_name, grpc_port=0, metrics_port=None, shutdown_grace_s=shutdown_grace_s
    )


@contextlib.asynccontextmanager
async def running_server(
    spec: ServiceSpec,
    *,
    settings: ServerSettings | None = None,
    metrics: RpcMetrics | None = None,
    tracer_provider: trace.TracerProvider | None = None,
) -> AsyncIterator[RunningServer]:
    """Run `spec` on 127.0.0.1:<free port> with the production interceptors; close at exit."""
    settings = settings if settings is not None else settings_for_tests()
    async with running(
        settings, spec, host="127.0.0.1", metrics=metrics, tracer_provider=tracer_provider
    ) as built:
        channel = make_channel(f"127.0.0.1:{built.port}", tracer_provider=tracer_provider)
        try:
            yield RunningServer(built.port, channel, built.health, built.server)
        finally:
            # Bounded like the server's own stop: a test must fail, never hang, on teardown.
            await asyncio.wait({asyncio.ensure_future(channel.close())}, timeout=5.0)


def bytes_service(
    service: str,
    *,
    unary: Mapping[str, Behavior] | None = None,
    server_streaming: Mapping[str, Behavior] | None = None,
    on_start: Hook | None = None,
    on_stop: Hook | None = None,
) -> ServiceSpec:
    """A ServiceSpec for a schema-less test service whose methods take and return raw bytes."""
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        name: grpc.unary_unary_rpc_method_handler(fn) for name, fn in (unary or {}).items()
    }
    for name, fn in (server_streaming or {}).items():
        handlers[name] = grpc.unary_stream_rpc_method_handler(fn)
    generic = grpc.method_handlers_generic_handler(service, handlers)

    def register(server: grpc.aio.Server) -> None:
        server.add_generic_rpc_handlers((generic,))

    return ServiceSpec((service,), register, on_start=on_start, on_stop=on_stop)


def bytes_unary(
    channel: grpc.aio.Channel, full_method: str
) -> grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]:
    """A typed callable for a unary method of a `bytes_service`."""
    method: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(full_method)
    return method


def bytes_stream(
    channel: grpc.aio.Channel, full_method: str
) -> grpc.aio.UnaryStreamMultiCallable[bytes, bytes]:
    """A typed callable for a server-streaming method of a `bytes_service`."""
    method: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(full_method)
    return method
