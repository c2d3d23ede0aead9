"""Prometheus endpoint and the standard per-RPC metrics."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
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

        # (service, method) -> its labelled children: `labels()` takes a lock and builds a
        # key on every call, and every RPC of every service records three of them.
        self._methods: dict[tuple[str, str], _MethodMetrics] = {}

    def _method(self, service: str, method: str) -> _MethodMetrics:
        found = self._methods.get((service, method))
        if found is None:
            found = _MethodMetrics(
                in_flight=self.in_flight.labels(service, method),
                duration=self.duration.labels(service, method),
                requests=self.requests,
                labels=(service, method),
            )
            self._methods[(service, method)] = found
        return found

    def started(self, service: str, method: str) -> None:
        """Count an RPC as in flight."""
        self._method(service, method).in_flight.inc()

    def finished(self, service: str, method: str, code: str, duration_s: float) -> None:
        """Record an RPC's outcome and duration."""
        self._method(service, method).finished(code, duration_s)


@dataclass(slots=True)
class _MethodMetrics:
    """One method's labelled children, resolved once."""

    in_flight: Gauge
    duration: Histogram
    requests: Counter  # the parent: children per status code are added as codes appear
    labels: tuple[str, str]
    by_code: dict[str, Counter] = field(default_factory=dict)

    def finished(self, code: str, duration_s: float) -> None:
        self.in_flight.dec()
        counter = self.by_code.get(code)
        if counter is None:
            counter = self.by_code[code] = self.requests.labels(*self.labels, code)
        counter.inc()
        self.duration.observe(duration_s)


@functools.cache
def default_rpc_metrics() -> RpcMetrics:
    """The process-wide RpcMetrics on the global registry, created on first use."""
    return RpcMetrics()


def split_method(full_method: str) -> tuple[str, str]:
    """`/pkg.Service/Method` -> (`pkg.Service`, `Method`)."""
    service, _, method = full_method.lstrip("/").rpartition("/")
    return service or "unknown", method or "unknown"
