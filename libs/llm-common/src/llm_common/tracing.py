"""OpenTelemetry setup: tracer provider, W3C propagation, OTLP export and gRPC interceptors."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from opentelemetry import propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.instrumentation.grpc import aio_client_interceptors, aio_server_interceptor
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator


def configure_tracing(
    service_name: str, otlp_endpoint: str | None, *, set_global: bool = True
) -> TracerProvider:
    """A provider for `service_name`, exporting over OTLP/gRPC only when an endpoint is given.

    With `set_global` it becomes the process-wide provider and W3C tracecontext + baggage
    become the propagators (OpenTelemetry allows setting the provider once per process).
    """
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if otlp_endpoint:
        provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(otlp_endpoint)))
    if set_global:
        propagate.set_global_textmap(
            CompositePropagator([TraceContextTextMapPropagator(), W3CBaggagePropagator()])
        )
        trace.set_tracer_provider(provider)
    return provider


def _otlp_exporter(endpoint: str) -> Any:
    # Imported here: the exporter pulls in its own gRPC stack, needless when export is off.
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=endpoint)


def get_tracer(name: str) -> trace.Tracer:
    """A tracer from the global provider (a no-op one until configure_tracing runs)."""
    return trace.get_tracer(name)


class _SkipWriterStreams(grpc.aio.ServerInterceptor):
    """Applies the OpenTelemetry server interceptor except to `context.write()` style streams.

    The upstream interceptor iterates every streaming behaviour with `async for`, which breaks
    coroutine handlers that write responses themselves (e.g. the health service's Watch).
    """

    def __init__(self, inner: grpc.aio.ServerInterceptor) -> None:
        self._inner = inner

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None or _is_writer_stream(handler):
            return handler

        async def resolved(_: grpc.HandlerCallDetails) -> Any:
            return handler

        return await self._inner.intercept_service(resolved, handler_call_details)


def _is_writer_stream(handler: grpc.RpcMethodHandler[Any, Any]) -> bool:
    behavior = handler.unary_stream or handler.stream_stream
    return behavior is not None and inspect.iscoroutinefunction(behavior)


def server_tracing_interceptor(
    tracer_provider: trace.TracerProvider | None = None,
) -> grpc.aio.ServerInterceptor:
    """A server span per RPC, continuing the caller's trace from its metadata."""
    return _SkipWriterStreams(
        aio_server_interceptor(tracer_provider=tracer_provider)  # type: ignore[no-untyped-call]
    )


def client_tracing_interceptors(
    tracer_provider: trace.TracerProvider | None = None,
) -> list[grpc.aio.ClientInterceptor]:
    """Client spans for the four call shapes, injecting traceparent into outgoing metadata."""
    make: Callable[..., list[grpc.aio.ClientInterceptor]] = aio_client_interceptors
    return make(tracer_provider=tracer_provider)
