"""The mesh's tunables as typed values (`infra/envoy/policy.yaml` is their YAML form).

Every field's default is what the renderer produced before the policy existed, so an empty
or default policy renders byte-for-byte today's configs. Each field carries its allowed
range in `metadata` (see `bounded`), which the loader checks and names in its errors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

HOUR_S = 3600.0
MAX_COUNT = 1_000_000
# Envoy's retry_on values for gRPC and HTTP (route.v3.RetryPolicy); others are refused.
RETRY_CONDITIONS = frozenset(
    {
        "cancelled",
        "deadline-exceeded",
        "internal",
        "resource-exhausted",
        "unavailable",
        "5xx",
        "gateway-error",
        "reset",
        "reset-before-request",
        "connect-failure",
        "envoy-ratelimited",
        "retriable-4xx",
        "refused-stream",
        "retriable-status-codes",
        "retriable-headers",
        "http3-post-connect-failure",
    }
)
# ext_authz's status_on_error: the HTTP code and the name Envoy's HttpStatus enum gives it.
AUTHZ_ERROR_STATUSES: Mapping[int, str] = MappingProxyType(
    {
        401: "Unauthorized",
        403: "Forbidden",
        429: "TooManyRequests",
        500: "InternalServerError",
        502: "BadGateway",
        503: "ServiceUnavailable",
        504: "GatewayTimeout",
    }
)


def bounded(default: Any, low: float, high: float, *, optional: bool = False) -> Any:
    """A numeric field allowed in [low, high]; `optional`: null is allowed too (Envoy's own
    default applies)."""
    return field(default=default, metadata={"range": (low, high), "optional": optional})


def conditions(*values: str) -> Any:
    return field(default=values, metadata={"choices": RETRY_CONDITIONS})


# ---- clusters ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CircuitBreakers:
    """Per-cluster limits (DEFAULT priority). For HTTP/2 `max_requests` (concurrent streams)
    is the one that bites; the retry budget replaces the fixed `max_retries` when both are set."""

    max_connections: int = bounded(1024, 1, MAX_COUNT)
    max_pending_requests: int = bounded(1024, 1, MAX_COUNT)
    max_requests: int = bounded(1024, 1, MAX_COUNT)
    max_retries: int | None = bounded(None, 0, MAX_COUNT, optional=True)
    retry_budget_percent: float | None = bounded(20.0, 0, 100, optional=True)
    min_retry_concurrency: int = bounded(5, 0, MAX_COUNT)


@dataclass(frozen=True, slots=True)
class OutlierDetection:
    """Passive ejection on consecutive failures (gRPC UNAVAILABLE counts as a gateway error)."""

    consecutive_5xx: int = bounded(3, 1, MAX_COUNT)
    consecutive_gateway_failure: int = bounded(3, 1, MAX_COUNT)
    enforcing_consecutive_5xx: int = bounded(100, 0, 100)
    enforcing_consecutive_gateway_failure: int = bounded(100, 0, 100)
    interval_s: float = bounded(1.0, 0.01, HOUR_S)
    base_ejection_time_s: float = bounded(30.0, 0.01, HOUR_S)
    max_ejection_time_s: float = bounded(300.0, 0.01, HOUR_S)
    max_ejection_percent: int = bounded(50, 0, 100)
    uneject_on_health_check_pass: bool = False


@dataclass(frozen=True, slots=True)
class HealthCheck:
    """Active gRPC (or HTTP) health checks; the no-traffic interval is the flavour's."""

    timeout_s: float = bounded(1.0, 0.01, 60)
    interval_s: float = bounded(1.0, 0.01, HOUR_S)
    interval_jitter_s: float = bounded(0.1, 0, 60)
    unhealthy_threshold: int = bounded(2, 1, 100)
    healthy_threshold: int = bounded(1, 1, 100)


@dataclass(frozen=True, slots=True)
class Http2:
    """Upstream HTTP/2: streams per connection and PING keepalive."""

    max_concurrent_streams: int = bounded(1000, 1, 2_147_483_647)
    keepalive_interval_s: float = bounded(30.0, 1, HOUR_S)
    keepalive_timeout_s: float = bounded(5.0, 0.1, HOUR_S)


@dataclass(frozen=True, slots=True)
class ClusterPolicy:
    """One upstream cluster's connection, breaker, ejection and health settings."""

    connect_timeout_s: float = bounded(0.5, 0.01, 60)
    panic_threshold_percent: float = bounded(0.0, 0, 100)
    buffer_limit_bytes: int | None = bounded(None, 1024, 2**31 - 1, optional=True)
    circuit_breakers: CircuitBreakers = field(default_factory=CircuitBreakers)
    outlier_detection: OutlierDetection = field(default_factory=OutlierDetection)
    health_check: HealthCheck = field(default_factory=HealthCheck)
    http2: Http2 = field(default_factory=Http2)


# ---- routes -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries happen only before the first response byte (trailers-only gRPC errors).
    `retry_on` serves idempotent calls; `retry_on_not_idempotent` the calls that must not be
    replayed once they may have reached the service (generations, counters)."""

    retry_on: tuple[str, ...] = conditions(
        "unavailable", "reset", "connect-failure", "refused-stream"
    )
    retry_on_not_idempotent: tuple[str, ...] = conditions("connect-failure", "refused-stream")
    num_retries: int = bounded(2, 0, 10)
    backoff_base_s: float = bounded(0.05, 0.001, 60)
    backoff_max_s: float = bounded(0.5, 0.001, 300)
    host_selection_max_attempts: int = bounded(3, 1, 10)


@dataclass(frozen=True, slots=True)
class UnaryRoute:
    """Quick request/response: a route timeout (also the cap on a client's grpc-timeout) and
    a per-try timeout, used only when `retry_on` lists `reset` (else it would not retry)."""

    timeout_s: float = bounded(15.0, 0.01, HOUR_S)
    per_try_timeout_s: float = bounded(5.0, 0.01, HOUR_S)
    retry: RetryPolicy = field(default_factory=RetryPolicy)


@dataclass(frozen=True, slots=True)
class StreamRoute:
    """Server streams: no route timer (Envoy could only reset a started stream), an idle
    timeout that every message resets."""

    idle_timeout_s: float = bounded(60.0, 0.01, HOUR_S)
    retry: RetryPolicy = field(default_factory=RetryPolicy)


@dataclass(frozen=True, slots=True)
class GenerationRoute:
    """Unary generations: silent until done, so the idle timer spans the call; the client's
    grpc-timeout is honoured up to `max_duration_s`."""

    idle_timeout_s: float = bounded(600.0, 0.01, 24 * HOUR_S)
    max_duration_s: float = bounded(600.0, 0.01, 24 * HOUR_S)
    retry: RetryPolicy = field(default_factory=RetryPolicy)


@dataclass(frozen=True, slots=True)
class EdgeRoutes:
    """The public surface by route class."""

    unary: UnaryRoute = field(default_factory=UnaryRoute)
    streaming: StreamRoute = field(default_factory=StreamRoute)
    generation: GenerationRoute = field(default_factory=GenerationRoute)
    admin: UnaryRoute = field(default_factory=UnaryRoute)


@dataclass(frozen=True, slots=True)
class ServiceTimeouts:
    """A mesh dependency's unary timeouts: a cache answering late is worse than a miss."""

    timeout_s: float = bounded(15.0, 0.01, HOUR_S)
    per_try_timeout_s: float = bounded(5.0, 0.01, HOUR_S)


def _mesh_unary() -> Mapping[str, ServiceTimeouts]:
    return MappingProxyType(
        {
            "tokenizer": ServiceTimeouts(10.0, 3.33333),
            "cache": ServiceTimeouts(1.5, 0.5),
            "billing": ServiceTimeouts(6.0, 2.0),
            "auth": ServiceTimeouts(3.0, 1.0),
        }
    )


@dataclass(frozen=True, slots=True)
class MeshRoutes:
    """What the router reaches through its mesh listener."""

    unary_retry: RetryPolicy = field(default_factory=RetryPolicy)
    streaming: StreamRoute = field(default_factory=StreamRoute)
    generation: GenerationRoute = field(default_factory=GenerationRoute)
    services: Mapping[str, ServiceTimeouts] = field(default_factory=_mesh_unary)
    change_feed_idle_timeout_s: float = bounded(60.0, 1, HOUR_S)
    replica_idle_timeout_s: float = bounded(120.0, 0.01, HOUR_S)
    replica_timeout_s: float = bounded(120.0, 0.01, HOUR_S)


# ---- edge filters -----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExtAuthz:
    """The auth check before every public call."""

    timeout_s: float = bounded(0.5, 0.01, 60)
    failure_mode_allow: bool = False
    status_on_error: int = field(default=503, metadata={"choices": frozenset(AUTHZ_ERROR_STATUSES)})


@dataclass(frozen=True, slots=True)
class RateLimit:
    """auth's rate-limit service (requests per minute per key and tenant)."""

    timeout_s: float = bounded(0.25, 0.001, 60)
    failure_mode_deny: bool = False


@dataclass(frozen=True, slots=True)
class LocalRateLimit:
    """A per-Envoy token bucket in front of everything (off unless configured)."""

    max_tokens: int = bounded(1000, 1, MAX_COUNT)
    tokens_per_fill: int = bounded(1000, 1, MAX_COUNT)
    fill_interval_s: float = bounded(1.0, 0.05, HOUR_S)


@dataclass(frozen=True, slots=True)
class Limits:
    """Header, buffer and body limits at the edge (null: Envoy's default)."""

    max_request_headers_kb: int = bounded(60, 1, 8192)
    listener_buffer_limit_bytes: int | None = bounded(None, 1024, 2**31 - 1, optional=True)
    # The router's own limit (OpenAI HTTP body, gRPC message): the edge refuses first, 413.
    max_request_body_bytes: int | None = bounded(4 * 1024 * 1024, 1024, 2**31 - 1, optional=True)
    max_response_body_bytes: int | None = bounded(None, 1024, 2**31 - 1, optional=True)


@dataclass(frozen=True, slots=True)
class EdgePolicy:
    """The gateway's filters and limits."""

    ext_authz: ExtAuthz = field(default_factory=ExtAuthz)
    rate_limit: RateLimit = field(default_factory=RateLimit)
    local_rate_limit: LocalRateLimit | None = None
    limits: Limits = field(default_factory=Limits)


# ---- the whole policy -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MeshPolicy:
    """Everything an operator tunes; `clusters` overrides `cluster_defaults` per upstream."""

    cluster_defaults: ClusterPolicy = field(default_factory=ClusterPolicy)
    clusters: Mapping[str, ClusterPolicy] = field(default_factory=lambda: MappingProxyType({}))
    edge_routes: EdgeRoutes = field(default_factory=EdgeRoutes)
    mesh_routes: MeshRoutes = field(default_factory=MeshRoutes)
    edge: EdgePolicy = field(default_factory=EdgePolicy)

    def cluster(self, name: str) -> ClusterPolicy:
        return self.clusters.get(name, self.cluster_defaults)


def seconds(value: float) -> str:
    """An Envoy duration as the renderer always wrote it (`0.5s`, `30s`)."""
    return f"{value:g}s"
