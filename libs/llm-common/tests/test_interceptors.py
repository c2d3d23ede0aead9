"""Request id, deadline and trace propagation across two real servers; access log + metrics."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import grpc
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

from llm_common.channels import make_channel
from llm_common.deadlines import CUSHION_MAX_S, CUSHION_SHARE, work_deadline
from llm_common.errors import parse_error
from llm_common.interceptors import REQUEST_ID_HEADER, request_id_from
from llm_common.logging import current_request_id, get_logger
from llm_common.metrics import RpcMetrics
from llm_testing import (
    LogCapture,
    bytes_service,
    bytes_stream,
    bytes_unary,
    running_server,
)

INNER, OUTER = "test.v1.Inner", "test.v1.Outer"
Context = grpc.aio.ServicerContext[bytes, bytes]


async def whoami(request: bytes, context: Context) -> bytes:
    get_logger("test.inner").info("inner handled")
    report = {"request_id": current_request_id(), "time_remaining": context.time_remaining()}
    return json.dumps(report).encode()


@dataclass
class Hops:
    outer: grpc.aio.Channel
    spans: InMemorySpanExporter
    metrics_registry: CollectorRegistry

    async def call(self, payload: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        response = await bytes_unary(self.outer, f"/{OUTER}/Forward")(
            json.dumps(payload).encode(), **kwargs
        )
        result: dict[str, Any] = json.loads(response)
        return result


@pytest.fixture
async def hops(registry: CollectorRegistry) -> AsyncIterator[Hops]:
    """client -> outer server -> (make_channel) -> inner server, traced in memory."""
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    metrics = RpcMetrics(registry)
    inner_spec = bytes_service(INNER, unary={"Whoami": whoami})
    async with running_server(inner_spec, tracer_provider=provider, metrics=metrics) as inner:
        to_inner = make_channel(inner.target, tracer_provider=provider)

        async def forward(request: bytes, context: Context) -> bytes:
            timeout = json.loads(request).get("timeout")
            response = await bytes_unary(to_inner, f"/{INNER}/Whoami")(b"", timeout=timeout)
            return json.dumps(
                {"outer": current_request_id(), "inner": json.loads(response)}
            ).encode()

        outer_spec = bytes_service(OUTER, unary={"Forward": forward})
        async with running_server(outer_spec, tracer_provider=provider, metrics=metrics) as outer:
            yield Hops(outer.channel, spans, registry)
        await to_inner.close()
    provider.shutdown()


async def test_request_id_flows_through_both_hops(hops: Hops, json_logs: LogCapture) -> None:
    result = await hops.call({}, metadata=((REQUEST_ID_HEADER, "req-42.abc"),))
    assert result["outer"] == "req-42.abc"
    assert result["inner"]["request_id"] == "req-42.abc"
    (line,) = json_logs.events("inner handled")
    assert line["request_id"] == "req-42.abc"
    assert line["service"] == "test"
    assert len(line["trace_id"]) == 32  # the server span is current in the handler
    assert len(line["span_id"]) == 16


@pytest.mark.parametrize("sent", [None, "", "has spaces", "x" * 129, "semi;colon"])
async def test_missing_or_malformed_ids_are_replaced(hops: Hops, sent: str | None) -> None:
    metadata = () if sent is None else ((REQUEST_ID_HEADER, sent),)
    result = await hops.call({}, metadata=metadata)
    generated = result["outer"]
    assert generated != sent
    assert len(generated) == 32
    int(generated, 16)
    assert result["inner"]["request_id"] == generated


def test_request_id_from_metadata() -> None:
    assert request_id_from([("other", "x"), (REQUEST_ID_HEADER, "abc")]) == "abc"
    assert len(request_id_from(None)) == 32


# gRPC rounds the wire timeout up and each server starts its clock on receipt, so a server
# may see a few milliseconds more than the caller's timeout; allow for that, no more.
SLACK_S = 0.05


async def test_incoming_deadline_caps_outgoing_calls(hops: Hops) -> None:
    result = await hops.call({"timeout": 30.0}, timeout=1.0)
    assert 0.5 < result["inner"]["time_remaining"] <= 1.0 + SLACK_S


async def test_outgoing_calls_end_a_cushion_before_the_caller(hops: Hops) -> None:
    # Their DEADLINE_EXCEEDED must come back in time to be this RPC's status.
    result = await hops.call({"timeout": 30.0}, timeout=1.0)
    assert result["inner"]["time_remaining"] <= 1.0 - CUSHION_MAX_S + 0.01


def test_the_cushion_is_a_share_of_short_deadlines() -> None:
    now = time.monotonic()
    assert work_deadline(None) is None
    assert work_deadline(10.0) == pytest.approx(now + 10.0 - CUSHION_MAX_S, abs=0.01)
    assert work_deadline(0.1) == pytest.approx(now + 0.1 * (1 - CUSHION_SHARE), abs=0.005)
    assert work_deadline(0.0) == pytest.approx(now, abs=0.005)


async def test_shorter_explicit_timeout_wins(hops: Hops) -> None:
    result = await hops.call({"timeout": 0.3}, timeout=5.0)
    assert 0.0 < result["inner"]["time_remaining"] <= 0.3 + SLACK_S


async def test_no_deadline_stays_unbounded(hops: Hops) -> None:
    result = await hops.call({})
    assert result["inner"]["time_remaining"] is None


async def test_one_trace_across_hops(hops: Hops) -> None:
    await hops.call({})
    spans = hops.spans.get_finished_spans()
    names = sorted(span.name for span in spans)
    # A client and a server span per hop.
    assert names == [f"/{INNER}/Whoami"] * 2 + [f"/{OUTER}/Forward"] * 2
    assert len({span.context.trace_id for span in spans}) == 1
    # Each server span is the child of the client span that made its call.
    by_kind = {(span.name, span.kind): span for span in spans}
    for method in (f"/{INNER}/Whoami", f"/{OUTER}/Forward"):
        client = by_kind[(method, SpanKind.CLIENT)]
        server = by_kind[(method, SpanKind.SERVER)]
        assert server.parent is not None
        assert server.parent.span_id == client.context.span_id
        assert server.attributes is not None
        assert server.attributes["rpc.grpc.status_code"] == 0
    outer_server = by_kind[(f"/{OUTER}/Forward", SpanKind.SERVER)]
    inner_client = by_kind[(f"/{INNER}/Whoami", SpanKind.CLIENT)]
    assert inner_client.parent is not None
    assert inner_client.parent.span_id == outer_server.context.span_id


async def test_failed_calls_mark_their_spans(hops: Hops) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await bytes_unary(hops.outer, f"/{OUTER}/Forward")(b"not json")
    assert caught.value.code() is grpc.StatusCode.INTERNAL
    (server,) = [s for s in hops.spans.get_finished_spans() if s.kind is SpanKind.SERVER]
    assert server.status.status_code is StatusCode.ERROR
    assert server.attributes is not None
    assert server.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INTERNAL.value[0]


async def test_access_log_and_metrics(hops: Hops, json_logs: LogCapture) -> None:
    await hops.call({})
    with pytest.raises(grpc.aio.AioRpcError):
        await bytes_unary(hops.outer, f"/{OUTER}/Forward")(b"not json")
    sample = hops.metrics_registry.get_sample_value
    labels = {"service": OUTER, "method": "Forward"}
    assert sample("llm_rpc_requests_total", {**labels, "code": "OK"}) == 1
    assert sample("llm_rpc_requests_total", {**labels, "code": "INTERNAL"}) == 1
    assert (
        sample("llm_rpc_requests_total", {"service": INNER, "method": "Whoami", "code": "OK"}) == 1
    )
    assert sample("llm_rpc_duration_seconds_count", labels) == 2
    assert sample("llm_rpc_in_flight", labels) == 0
    lines = [line for line in json_logs.events("rpc") if line["method"] == f"/{OUTER}/Forward"]
    assert [line["code"] for line in lines] == ["OK", "INTERNAL"]
    assert [line["level"] for line in lines] == ["info", "warning"]
    assert all(line["duration_ms"] >= 0 and line["peer"] for line in lines)
    assert all(len(line["request_id"]) == 32 for line in lines)


QUIET = "test.v1.Quiet"
CANCELLED_STREAMS = 1000


async def echo(request: bytes, context: Context) -> bytes:
    return request


class DenyOddCalls(grpc.aio.ServerInterceptor):
    """An inner interceptor that picks a handler per call, from the call's metadata."""

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        handler = await continuation(details)
        if ("deny", "1") not in tuple(details.invocation_metadata or ()):
            return handler

        async def deny(request: bytes, context: Context) -> bytes:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, "denied")
            raise AssertionError("unreachable")

        return grpc.unary_unary_rpc_method_handler(deny)


async def test_quiet_methods_log_at_debug_and_inner_handlers_are_not_cached(
    registry: CollectorRegistry, json_logs: LogCapture
) -> None:
    base = bytes_service(QUIET, unary={"Echo": echo, "Loud": echo})
    spec = replace(base, quiet_methods=frozenset({f"/{QUIET}/Echo"}), interceptors=[DenyOddCalls()])
    async with running_server(spec, metrics=RpcMetrics(registry)) as server:
        echo_call = bytes_unary(server.channel, f"/{QUIET}/Echo")
        assert await echo_call(b"a") == b"a"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await echo_call(b"b", metadata=(("deny", "1"),))
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert await echo_call(b"c") == b"c"  # the cached wrapper still serves the real handler
        assert await bytes_unary(server.channel, f"/{QUIET}/Loud")(b"d") == b"d"
    levels = {(line["method"], line["code"], line["level"]) for line in json_logs.events("rpc")}
    assert (f"/{QUIET}/Echo", "OK", "debug") in levels
    assert (f"/{QUIET}/Echo", "PERMISSION_DENIED", "debug") in levels
    assert (f"/{QUIET}/Loud", "OK", "info") in levels
    sample = registry.get_sample_value
    assert sample("llm_rpc_requests_total", {"service": QUIET, "method": "Echo", "code": "OK"}) == 2


async def test_self_logged_methods_keep_only_their_failures_at_info(
    registry: CollectorRegistry, json_logs: LogCapture
) -> None:
    base = bytes_service(QUIET, unary={"Echo": echo})
    spec = replace(
        base, logged_methods=frozenset({f"/{QUIET}/Echo"}), interceptors=[DenyOddCalls()]
    )
    async with running_server(spec, metrics=RpcMetrics(registry)) as server:
        echo_call = bytes_unary(server.channel, f"/{QUIET}/Echo")
        assert await echo_call(b"a") == b"a"
        with pytest.raises(grpc.aio.AioRpcError):
            await echo_call(b"b", metadata=(("deny", "1"),))
    levels = {(line["code"], line["level"]) for line in json_logs.events("rpc")}
    assert levels == {("OK", "debug"), ("PERMISSION_DENIED", "info")}


async def endless(request: bytes, context: Context) -> AsyncIterator[bytes]:
    while True:
        yield b"tick"
        await asyncio.sleep(0)


async def test_cancelled_streams_are_logged_without_crashing(
    registry: CollectorRegistry, json_logs: LogCapture
) -> None:
    """Regression: reading the peer of a cancelled stream at the end crashed the process."""
    spec = bytes_service("test.v1.Stream", server_streaming={"Ticks": endless})
    async with running_server(spec, metrics=RpcMetrics(registry)) as server:
        ticks = bytes_stream(server.channel, "/test.v1.Stream/Ticks")
        for _ in range(CANCELLED_STREAMS):
            call = ticks(b"")
            async for _tick in call:
                break
            call.cancel()
        call = ticks(b"")
        assert await call.read() == b"tick"  # the server is still alive and serving
        call.cancel()
    await asyncio.sleep(0.1)  # let the server record the last cancellations
    codes = [line["code"] for line in json_logs.events("rpc")]
    assert codes.count("CANCELLED") >= CANCELLED_STREAMS // 2
    assert all(line["peer"] for line in json_logs.events("rpc"))
    # A cancelled stream is closed from another context; restoring the trace context there
    # is skipped, not logged as an error per cancel.
    assert not [line for line in json_logs.records() if line.get("level") == "error"]


async def test_undecodable_request_is_invalid_argument(hops: Hops) -> None:
    # grpc.aio answers UNKNOWN (and logs an error) when the request does not parse; the
    # interceptor makes it the client's INVALID_ARGUMENT, with the field violation.
    check = bytes_unary(hops.outer, "/grpc.health.v1.Health/Check")
    for body in (b"\xff\xff\xff\xff", b"\x0a\x80", b"\x0a\x03\xed\xa0\x80"):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await check(body)
        assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT, body
        (violation,) = parse_error(caught.value).field_violations
        assert "not a valid message" in violation.description
    assert (await check(b"")) is not None  # the server is fine afterwards
