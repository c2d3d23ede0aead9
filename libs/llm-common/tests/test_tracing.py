"""The tracer provider: what is recorded with and without somewhere to export to."""

from __future__ import annotations

import grpc
from opentelemetry import propagate, trace

from llm_common.tracing import (
    ServerSpan,
    configure_tracing,
    context_headers,
    rpc_tracer,
    start_client_span,
    unsampled_parent,
)

SAMPLED_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
UNSAMPLED_PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"


def test_without_an_exporter_roots_carry_context_but_record_nothing() -> None:
    tracer = rpc_tracer(configure_tracing("svc", None, set_global=False))
    span = tracer.start_span("root")
    assert not span.is_recording()
    context = span.get_span_context()
    assert context.is_valid  # ids for logs and for the next hop all the same
    assert not context.trace_flags.sampled
    headers = dict(context_headers(span))
    assert headers["traceparent"].startswith(f"00-{context.trace_id:032x}-")


def test_without_an_exporter_a_sampled_caller_is_still_honoured() -> None:
    tracer = rpc_tracer(configure_tracing("svc", None, set_global=False))
    for parent, recorded in ((SAMPLED_PARENT, True), (UNSAMPLED_PARENT, False)):
        context = propagate.extract({"traceparent": parent})
        span = tracer.start_span("child", context=context)
        assert span.is_recording() is recorded
        assert span.get_span_context().trace_id == 0x0AF7651916CD43DD8448EB211C80319C


def test_client_span_continues_the_current_trace() -> None:
    tracer = rpc_tracer(configure_tracing("svc", None, set_global=False))
    parent = tracer.start_span("parent", context=propagate.extract({"traceparent": SAMPLED_PARENT}))
    with trace.use_span(parent):
        child = start_client_span(tracer, "/a.B/C")
    assert child.get_span_context().trace_id == parent.get_span_context().trace_id
    assert child.is_recording()


def test_an_unsampled_trace_gets_no_client_spans_but_keeps_its_ids() -> None:
    tracer = rpc_tracer(configure_tracing("svc", None, set_global=False))
    parent = tracer.start_span(
        "parent", context=propagate.extract({"traceparent": UNSAMPLED_PARENT})
    )
    with trace.use_span(parent):
        assert unsampled_parent() is parent
        child = start_client_span(tracer, "/a.B/C")
        headers = dict(context_headers(child))
    assert child is parent  # no span built that nothing would record
    assert headers["traceparent"].startswith("00-0af7651916cd43dd8448eb211c80319c-")
    assert headers["traceparent"].endswith("-00")


def test_without_a_current_span_the_sampler_still_decides() -> None:
    # No trace yet: a root is started, so an exporting provider records it as before.
    assert unsampled_parent() is None
    provider = configure_tracing("svc", "127.0.0.1:4317", set_global=False)
    try:
        assert start_client_span(rpc_tracer(provider), "/a.B/C").is_recording()
    finally:
        provider.shutdown()  # nothing was ended, so nothing is exported


def test_a_server_span_in_an_unsampled_trace_is_the_callers_context() -> None:
    tracer = rpc_tracer(configure_tracing("svc", None, set_global=False))
    for parent, recorded in ((UNSAMPLED_PARENT, False), (SAMPLED_PARENT, True)):
        served = ServerSpan.start(tracer, "/a.B/C", [("traceparent", parent)])
        try:
            current = trace.get_current_span().get_span_context()
            assert current.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
            assert served.span.is_recording() is recorded
            # Unsampled: nothing new was built, the caller's span stays current.
            assert (current.span_id == 0xB7AD6B7169203331) is not recorded
        finally:
            served.end(grpc.StatusCode.OK)
    assert not trace.get_current_span().get_span_context().is_valid  # both detached
