"""Prometheus endpoint and the standard per-RPC metrics."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import start_wsgi_server

# RPC latencies range from sub-millisecond lookups to minutes-long generation streams.
RPC_DURATION_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class MetricsEndpoint:
    """A running /metrics HTTP server."""

    port: int
    server: WSGIServer

    def close(self) -> None:
        """Stop serving and release the socket."""
        self.server.shutdown()
        self.server.server_close()


def serve_metrics(
    port: int, registry: CollectorRegistry | None = None, *, addr: str = "0.0.0.0"
) -> MetricsEndpoint:
    """Serve `registry` (default: the global one) over HTTP in a daemon thread."""
    server, _ = start_wsgi_server(port, addr=addr, registry=registry or REGISTRY)
    return MetricsEndpoint(port=server.server_port, server=server)


def start_metrics_server(port: int, registry: CollectorRegistry | None = None) -> int:
    """Start the /metrics endpoint (port 0 picks a free one) and return the bound port."""
    return serve_metrics(port, registry).port


class RpcMetrics:
    """`llm_rpc_*` request count, latency and in-flight metrics, labelled by gRPC service and
    method; bound to one registry so tests can use a fresh one."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else REGISTRY
        self.requests = Counter(
            "llm_rpc_requests",
            "RPCs handled, by final status code.",
            ["service", "method", "code"],
            registry=registry,
        )
        self.duration = Histogram(
            "llm_rpc_duration_seconds",
            "RPC handling time, until the last response message or error.",
            ["service", "method"],
            buckets=RPC_DURATION_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "llm_rpc_in_flight",
            "RPCs being handled now.",
            ["service", "method"],
            registry=registry,
        )

    def started(self, service: str, method: str) -> None:
        """Count an RPC as in flight."""
        self.in_flight.labels(service, method).inc()

    def finished(self, service: str, method: str, code: str, duration_s: float) -> None:
        """Record an RPC's outcome and duration."""
        self.in_flight.labels(service, method).dec()
        self.requests.labels(service, method, code).inc()
        self.duration.labels(service, method).observe(duration_s)


@functools.cache
def default_rpc_metrics() -> RpcMetrics:
    """The process-wide RpcMetrics on the global registry, created on first use."""
    return RpcMetrics()


def split_method(full_method: str) -> tuple[str, str]:
    """`/pkg.Service/Method` -> (`pkg.Service`, `Method`)."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service or "unknown", method or "unknown"
