"""Envoy clusters: one per service with breakers, outlier detection and gRPC health checks."""

from __future__ import annotations

from typing import Any

from llm_envoy.policy_model import (
    CircuitBreakers,
    ClusterPolicy,
    HealthCheck,
    Http2,
    OutlierDetection,
    seconds,
)
from llm_envoy.topology import (
    MESH_CA,
    MESH_CERT,
    MESH_KEY,
    REPLICA_HEADER,
    Endpoint,
    Layout,
    ReplicaPath,
    Upstream,
)

Config = dict[str, Any]
REPLICA_CLUSTER = "inference_replica"
REPLICA_DNS_CACHE = "inference_replicas"
ADMIN_CLUSTER = "envoy_admin"
PROTOCOL_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def address(endpoint: Endpoint) -> Config:
    return {"socket_address": {"address": endpoint.host, "port_value": endpoint.port}}


def _protocol_options(http1: bool, h2: Http2) -> Config:
    if http1:
        explicit: Config = {"http_protocol_options": {}}
    else:
        # HTTP/2 PINGs find dead connections that TCP keepalive would notice only after minutes.
        explicit = {
            "http2_protocol_options": {
                "max_concurrent_streams": h2.max_concurrent_streams,
                "connection_keepalive": {
                    "interval": seconds(h2.keepalive_interval_s),
                    "timeout": seconds(h2.keepalive_timeout_s),
                },
            }
        }
    return {
        PROTOCOL_OPTIONS: {
            "@type": f"type.googleapis.com/{PROTOCOL_OPTIONS}",
            "explicit_http_config": explicit,
        }
    }


def _number(value: float) -> float | int:
    """Whole numbers as integers, as the configs always had them."""
    return int(value) if float(value).is_integer() else value


def circuit_breakers(cb: CircuitBreakers) -> Config:
    """For HTTP/2 `max_requests` (concurrent streams) is the limit that matters; the retry
    budget replaces the cluster-wide default of 3 concurrent retries."""
    threshold: Config = {
        "priority": "DEFAULT",
        "max_connections": cb.max_connections,
        "max_pending_requests": cb.max_pending_requests,
        "max_requests": cb.max_requests,
    }
    if cb.max_retries is not None:
        threshold["max_retries"] = cb.max_retries
    if cb.retry_budget_percent is not None:
        threshold["retry_budget"] = {
            "budget_percent": {"value": float(cb.retry_budget_percent)},
            "min_retry_concurrency": cb.min_retry_concurrency,
        }
    threshold["track_remaining"] = True
    return {"thresholds": [threshold]}


def outlier_detection(od: OutlierDetection) -> Config:
    """Eject a replica after N gateway errors (gRPC UNAVAILABLE counts). The enforcing
    percentage defaults to 0 in Envoy (detect, never eject), and a passing health check would
    un-eject a host that still fails real requests: both are set explicitly."""
    return {
        "consecutive_5xx": od.consecutive_5xx,
        "consecutive_gateway_failure": od.consecutive_gateway_failure,
        "enforcing_consecutive_5xx": od.enforcing_consecutive_5xx,
        "enforcing_consecutive_gateway_failure": od.enforcing_consecutive_gateway_failure,
        "interval": seconds(od.interval_s),
        "base_ejection_time": seconds(od.base_ejection_time_s),
        "max_ejection_time": seconds(od.max_ejection_time_s),
        "max_ejection_percent": od.max_ejection_percent,
        "successful_active_health_check_uneject_host": od.uneject_on_health_check_pass,
    }


def health_check(
    service: str | None,
    event_log: str,
    idle_interval: str = "5s",
    *,
    path: str | None = None,
    hc: HealthCheck | None = None,
) -> Config:
    """Active check every second, grpc.health.v1 of `service` or HTTP GET of `path`; clusters
    that never had traffic every `idle_interval` (Envoy's default of 60 s would leave a late
    starter unhealthy for a minute)."""
    check: Config = (
        {"http_health_check": {"path": path}}
        if path is not None
        else {"grpc_health_check": {"service_name": service}}
    )
    hc = hc or HealthCheck()
    return {
        "timeout": seconds(hc.timeout_s),
        "interval": seconds(hc.interval_s),
        "interval_jitter": seconds(hc.interval_jitter_s),
        "unhealthy_threshold": hc.unhealthy_threshold,
        "healthy_threshold": hc.healthy_threshold,
        "no_traffic_interval": idle_interval,
        "always_log_health_check_failures": True,
        "event_logger": [
            {
                "name": "envoy.health_check.event_sink.file",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.health_check.event_sinks"
                    ".file.v3.HealthCheckEventFileSink",
                    "event_log_path": event_log,
                },
            }
        ],
        **check,
    }


def upstream_tls(peer_identity: str, *, http1: bool = False, sni: str | None = None) -> Config:
    """mTLS to a peer sidecar: present this workload's certificate, accept only `peer_identity`."""
    context: Config = {
        "common_tls_context": {
            "alpn_protocols": ["http/1.1"] if http1 else ["h2"],
            "tls_certificates": [
                {
                    "certificate_chain": {"filename": MESH_CERT},
                    "private_key": {"filename": MESH_KEY},
                }
            ],
            "validation_context": {
                "trusted_ca": {"filename": MESH_CA},
                "match_typed_subject_alt_names": [
                    {"san_type": "URI", "matcher": {"exact": peer_identity}}
                ],
            },
        },
    }
    if sni is not None:
        context["sni"] = sni
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3"
            ".UpstreamTlsContext",
            **context,
        },
    }


def service_cluster(up: Upstream, layout: Layout) -> Config:
    """A balanced, health-checked cluster for one service."""
    policy = layout.policy.cluster(up.name)
    cluster: Config = {
        "name": up.name,
        "type": "STRICT_DNS" if up.dns else "STATIC",
        "connect_timeout": seconds(policy.connect_timeout_s),
        # P2C on in-flight requests: a slow replica gets fewer new ones.
        "lb_policy": "LEAST_REQUEST",
        "least_request_lb_config": {"choice_count": 2},
        # Envoy's default 50 % sends traffic to failing hosts once half are unhealthy.
        "common_lb_config": {
            "healthy_panic_threshold": {"value": _number(policy.panic_threshold_percent)}
        },
        "typed_extension_protocol_options": _protocol_options(up.http1, policy.http2),
        "circuit_breakers": circuit_breakers(policy.circuit_breakers),
        "outlier_detection": outlier_detection(policy.outlier_detection),
        "load_assignment": {
            "cluster_name": up.name,
            "endpoints": [
                {"lb_endpoints": [{"endpoint": {"address": address(e)}} for e in up.endpoints]}
            ],
        },
    }
    if up.dns:
        cluster["dns_lookup_family"] = "V4_ONLY"
    if up.health_service is not None or up.health_path is not None:
        cluster["health_checks"] = [
            health_check(
                up.health_service,
                layout.health_event_log,
                layout.health_idle_interval,
                path=up.health_path,
                hc=policy.health_check,
            )
        ]
    if layout.mesh_tls and up.peer_identity is not None:
        cluster["transport_socket"] = upstream_tls(up.peer_identity, http1=up.http1)
    _buffer_limit(cluster, policy)
    return cluster


def _buffer_limit(cluster: Config, policy: ClusterPolicy) -> None:
    if policy.buffer_limit_bytes is not None:
        cluster["per_connection_buffer_limit_bytes"] = policy.buffer_limit_bytes


def plain_cluster(
    name: str, endpoint: Endpoint, policy: ClusterPolicy, *, http1: bool = False
) -> Config:
    """A single local endpoint without health checks (collector, the sidecar's own app).
    Its connect timeout stays 1 s: the peer is on loopback or a collector."""
    cluster: Config = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": _protocol_options(http1, policy.http2),
        "circuit_breakers": circuit_breakers(policy.circuit_breakers),
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address(endpoint)}}]}],
        },
    }
    _buffer_limit(cluster, policy)
    return cluster


def dns_cache_config() -> Config:
    return {"name": REPLICA_DNS_CACHE, "dns_lookup_family": "V4_ONLY", "host_ttl": "300s"}


def replica_cluster(layout: Layout, peer_identity: str | None) -> Config:
    """The replica the router chose, named in the `x-envoy-original-dst-host` header.

    No health checks or retries here: the router watches each replica's load and re-dispatches
    before the first token itself, and a hop must not be retried at two layers.
    """
    policy = layout.policy.cluster(REPLICA_CLUSTER)
    cluster: Config = {
        "name": REPLICA_CLUSTER,
        "connect_timeout": seconds(policy.connect_timeout_s),
        "lb_policy": "CLUSTER_PROVIDED",
        "typed_extension_protocol_options": _protocol_options(False, policy.http2),
        "circuit_breakers": circuit_breakers(policy.circuit_breakers),
    }
    if layout.replica_path is ReplicaPath.ORIGINAL_DST:
        cluster["type"] = "ORIGINAL_DST"
        cluster["original_dst_lb_config"] = {
            "use_http_header": True,
            "http_header_name": REPLICA_HEADER,
        }
        cluster["cleanup_interval"] = "60s"
    else:
        cluster["cluster_type"] = {
            "name": "envoy.clusters.dynamic_forward_proxy",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.clusters.dynamic_forward_proxy"
                ".v3.ClusterConfig",
                "dns_cache_config": dns_cache_config(),
                # auto_san_validation would match the certificate against the pod's DNS name;
                # the mesh checks the peer's SPIFFE id instead (upstream_tls below).
                "allow_insecure_cluster_options": True,
            },
        }
    if layout.mesh_tls and peer_identity is not None:
        cluster["transport_socket"] = upstream_tls(peer_identity)
    _buffer_limit(cluster, policy)
    return cluster
