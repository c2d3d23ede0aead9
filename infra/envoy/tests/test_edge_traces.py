"""Issue 32, finding 4 beyond the access log, on a real Envoy with tracing on: the edge's Lua
scrub (llm_envoy.query_scrub) removes credential-like query parameters, whatever their case
or encoding, before anything reads the path, so the trace spans Envoy exports (`http.url`)
carry none; other parameters stay. The upstream's view: test_edge_logs.py."""

from __future__ import annotations

import asyncio
import threading
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
import pytest_asyncio
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from llm_envoy.testing import RunningEdge, running_edge, wait_for
from llm_envoy.topology import Endpoint

from .conftest import PROTOS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.security,
    pytest.mark.asyncio(loop_scope="module"),
]

SECRET = "QUERYSECRET0123456789"
# Names a list of exact spellings would miss: case, percent-encoding, prefixes, separators.
SENSITIVE = ("api_key", "API%5FKey", "X-Auth-Token", "Signature", "sessionid", "access_token")
QUERY = "&".join(["model=demo", *(f"{name}={SECRET}" for name in SENSITIVE), "limit=3"])


@dataclass
class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """OTLP/gRPC: every span attribute Envoy exports, as text."""

    attributes: list[tuple[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
        found = [
            (a.key, a.value.string_value)
            for spans in request.resource_spans
            for scope in spans.scope_spans
            for span in scope.spans
            for a in span.attributes
        ]
        with self.lock:
            self.attributes.extend(found)
        return trace_service_pb2.ExportTraceServiceResponse()

    def urls(self) -> list[str]:
        with self.lock:
            return [value for key, value in self.attributes if key == "http.url"]


@pytest.fixture(scope="module")
def collector() -> Iterator[tuple[Collector, int]]:
    receiver = Collector()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield receiver, port
    server.stop(grace=None)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def edge(
    collector: tuple[Collector, int], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RunningEdge]:
    workdir = tmp_path_factory.mktemp("traced")
    otlp = Endpoint("127.0.0.1", collector[1])
    async with running_edge(workdir, PROTOS, auth=None, otlp=otlp) as envoy:
        yield envoy


def _get(edge: RunningEdge, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://{edge.edge_http}{path}", timeout=10) as reply:
            status: int = reply.status
            return status
    except urllib.error.HTTPError as err:
        return err.code


async def test_trace_spans_carry_no_query_credentials(
    edge: RunningEdge, collector: tuple[Collector, int]
) -> None:
    receiver = collector[0]
    # No auth in this Envoy: ext_authz fails closed (503); the span is exported all the same.
    assert await asyncio.to_thread(_get, edge, f"/v1/models?{QUERY}") == 503
    assert await asyncio.to_thread(wait_for, lambda: bool(receiver.urls()))
    (url,) = receiver.urls()
    assert url.endswith("/v1/models?model=demo&limit=3")
    assert all(SECRET not in value for _, value in receiver.attributes)
