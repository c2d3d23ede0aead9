"""OpenTelemetry: tracer provider, W3C propagation, OTLP export, and the spans of gRPC calls.

RPC spans are made here by hand instead of by opentelemetry-instrumentation-grpc: its aio
interceptors cost about 0.1 ms of CPU per call on each side (an extra task and wrapper per
call), a third of a whole loopback round trip.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from llm_common.context_tokens import restore


def configure_tracing(
    service_name: str, otlp_endpoint: str | None, *, set_global: bool = True
) -> TracerProvider:
    """A provider for `service_name`, exporting over OTLP/gRPC only when an endpoint is given
    (without one, only spans whose caller sampled them are recorded).

    With `set_global` it becomes the process-wide provider and W3C tracecontext + baggage
    become the propagators (OpenTelemetry allows setting the provider once per process).
    """
    resource = Resource.create({"service.name": service_name})
    if otlp_endpoint:
        # The sampler comes from OTEL_TRACES_SAMPLER(_ARG), parent-based always-on by default.
        provider = TracerProvider(resource=resource)
        provider.add_span_processor(BatchSpanProcessor(_otlp_exporter(otlp_endpoint)))
    else:
        # Nowhere to export: record only what the caller sampled (someone upstream collects
        # it), and otherwise only carry the trace context along, which costs next to nothing.
        provider = TracerProvider(resource=resource, sampler=ParentBased(ALWAYS_OFF))
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


# Only these keys carry trace context (W3C traceparent/tracestate, baggage).
_CONTEXT_KEYS = frozenset({"traceparent", "tracestate", "baggage"})
# Server spans are errors only for these codes (OpenTelemetry RPC conventions); client
# spans for any code but OK.
_SERVER_ERROR_CODES = frozenset(
    {
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNIMPLEMENTED,
        grpc.StatusCode.INTERNAL,
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DATA_LOSS,
    }
)
RPC_TRACER = "llm_common.rpc"


def rpc_tracer(provider: trace.TracerProvider | None = None) -> trace.Tracer:
    """The tracer of RPC spans: from `provider`, or the global one (resolved lazily)."""
    if provider is None:
        return trace.get_tracer(RPC_TRACER)
    return provider.get_tracer(RPC_TRACER)


def _rpc_attributes(full_method: str) -> dict[str, str]:
    service, _, method = full_method.lstrip("/").partition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}


@dataclass(slots=True)
class ServerSpan:
    """The span of one served RPC, current while its handler runs."""

    span: trace.Span
    token: object
    context: otel_context.Context

    @classmethod
    def start(
        cls, tracer: trace.Tracer, full_method: str, metadata: Iterable[tuple[str, Any]] | None
    ) -> ServerSpan:
        """Continue the caller's trace from `metadata` (or start one) and make it current."""
        carrier = {k: v for k, v in metadata or () if k in _CONTEXT_KEYS and isinstance(v, str)}
        parent = propagate.extract(carrier) if carrier else None
        if parent is not None:
            caller = trace.get_current_span(parent)
            if _unsampled(caller):
                # The caller's trace is not recorded, so no span of ours would be: its context
                # (trace id for the logs, traceparent for the next hop) is all it carries.
                return cls(caller, otel_context.attach(parent), parent)
        span = tracer.start_span(
            full_method,
            context=parent,
            kind=trace.SpanKind.SERVER,
            attributes=_rpc_attributes(full_method),
        )
        context = trace.set_span_in_context(span, parent)
        return cls(span, otel_context.attach(context), context)

    def end(self, code: grpc.StatusCode | None) -> None:
        """Record the final status, end the span and restore the previous context."""
        self.finish(code)
        self.detach()

    def detach(self) -> None:
        """Restore the context from before start() (in the context that started the span)."""
        if otel_context.get_current() is not self.context:
            return
        token = self.token
        if isinstance(token, contextvars.Token):
            # Not otel_context.detach: it logs an error when the handler ends in another
            # context (a copy holds the same value, so the check above passes), which a
            # cancelled stream does on every client cancel.
            restore(token)
        else:
            otel_context.detach(token)  # type: ignore[arg-type]

    def finish(self, code: grpc.StatusCode | None) -> None:
        """Record the final status and end the span; any time, from any context."""
        _finish(self.span, code, _SERVER_ERROR_CODES)


def _finish(
    span: trace.Span, code: grpc.StatusCode | None, errors: frozenset[grpc.StatusCode] | None
) -> None:
    if code is not None:
        span.set_attribute("rpc.grpc.status_code", code.value[0])
        failed = code is not grpc.StatusCode.OK if errors is None else code in errors
        if failed:
            span.set_status(trace.Status(trace.StatusCode.ERROR, code.name))
    span.end()


def unsampled_parent() -> trace.Span | None:
    """The current span when it is a valid, unsampled one, else None.

    Under parent-based sampling (what configure_tracing sets up, and OpenTelemetry's
    default) no child of such a span is recorded either, yet the SDK still builds one,
    with ids, attributes and a sampler call (about 15 us each). Code that would start a
    child span can use this span instead: every method of a non-recording span is a
    no-op, and its context carries the same trace id to the next hop and to the logs.
    """
    span = trace.get_current_span()
    return span if _unsampled(span) else None


def _unsampled(span: trace.Span) -> bool:
    context = span.get_span_context()
    return context.is_valid and not context.trace_flags.sampled and not span.is_recording()


def start_client_span(tracer: trace.Tracer, full_method: str) -> trace.Span:
    """A client span for an outgoing call, child of the current context (or, in an
    unsampled trace, the current span itself: see unsampled_parent)."""
    unsampled = unsampled_parent()
    if unsampled is not None:
        return unsampled
    return tracer.start_span(
        full_method, kind=trace.SpanKind.CLIENT, attributes=_rpc_attributes(full_method)
    )


def context_headers(span: trace.Span) -> list[tuple[str, str]]:
    """The metadata entries that carry `span`'s context (and current baggage) downstream."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier, context=trace.set_span_in_context(span))
    return list(carrier.items())


def end_client_span(span: trace.Span, code: grpc.StatusCode | None) -> None:
    """End a client span with the call's final status (None when it could not be read)."""
    _finish(span, code, None)
