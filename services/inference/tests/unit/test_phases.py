"""Phase spans (queue, prefill, decode) placed from a finished request's timings."""

from __future__ import annotations

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llm_inference.engine.api import FinishReason, RequestTimings, TokenEvent
from llm_inference.phases import record_phases

MS = 1_000_000


def test_child_spans_follow_the_timings() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    event = TokenEvent(
        token_ids=(1,), text_delta="", logprobs=None, finish_reason=FinishReason.STOP,
        prompt_tokens=12, completion_tokens=5, cached_tokens=8,
        timings=RequestTimings(queue_ms=2.0, prefill_ms=6.0, ttft_ms=9.0, decode_ms=20.0),
    )  # fmt: skip
    arrival = 1_000 * MS
    with tracer.start_as_current_span("rpc") as rpc:
        record_phases(arrival, event, tracer=tracer)
    spans = {span.name: span for span in exporter.get_finished_spans()}
    rpc_id = rpc.get_span_context().span_id
    expected = {
        "inference.queue": (arrival, arrival + 2 * MS),
        "inference.prefill": (arrival + 2 * MS, arrival + 9 * MS),
        "inference.decode": (arrival + 9 * MS, arrival + 29 * MS),
    }
    for name, (start, end) in expected.items():
        span = spans[name]
        assert (span.start_time, span.end_time) == (start, end)
        assert span.parent is not None
        assert span.parent.span_id == rpc_id
    attributes = spans["rpc"].attributes or {}
    assert attributes["llm.cached_tokens"] == 8
    assert attributes["llm.ttft_ms"] == 9.0
