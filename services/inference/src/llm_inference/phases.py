"""Trace spans for a finished request's phases (queue, prefill, decode), from its timings."""

from __future__ import annotations

from opentelemetry import trace

from llm_common.tracing import unsampled_parent
from llm_inference.engine.api import TokenEvent

_tracer = trace.get_tracer(__name__)
_MS = 1_000_000  # nanoseconds


def record_phases(arrival_ns: int, event: TokenEvent, tracer: trace.Tracer | None = None) -> None:
    """Child spans of the current (RPC) span, placed on the wall clock from `arrival_ns`.

    The engine measures phases in its own thread; the spans are written afterwards with
    explicit start and end times, so the step loop never touches tracing.
    """
    timings = event.timings
    if timings is None or unsampled_parent() is not None:  # nothing would be recorded
        return
    queue_end = arrival_ns + int(timings.queue_ms * _MS)
    first_token = arrival_ns + int(timings.ttft_ms * _MS)
    phases = (
        ("queue", arrival_ns, queue_end),
        ("prefill", queue_end, max(queue_end, first_token)),
        ("decode", first_token, first_token + int(timings.decode_ms * _MS)),
    )
    tracer = tracer if tracer is not None else _tracer
    for name, start, end in phases:
        span = tracer.start_span(f"inference.{name}", start_time=start)
        span.end(end_time=end)
    trace.get_current_span().set_attributes(
        {
            "llm.prompt_tokens": event.prompt_tokens,
            "llm.completion_tokens": event.completion_tokens,
            "llm.cached_tokens": event.cached_tokens,
            "llm.ttft_ms": timings.ttft_ms,
        }
    )
