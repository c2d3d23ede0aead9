"""Envoy clusters: one per service with breakers, outlier detection and gRPC health checks."""

from __future__ import annotations

from typing import Any

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


def _protocol_options(http1: bool) -> Config:
    if http1:
        explicit: Config = {"http_protocol_options": {}}
    else:
        # HTTP/2 PINGs find dead connections that TCP keepalive would notice only after minutes.
        explicit = {
            "http2_protocol_options": {
                "max_concurrent_streams": 1000,
                "connection_keepalive": {"interval": "30s", "timeout": "5s"},
            }
        }
    return {
        PROTOCOL_OPTIONS: {
            "@type": f"type.googleapis.com/{PROTOCOL_OPTIONS}",
            "explicit_http_config": explicit,
        }
    }


def circuit_breakers(max_requests: int = 1024) -> Config:
    """For HTTP/2 `max_requests` (concurrent streams) is the limit that matters; the retry
    budget replaces the cluster-wide default of 3 concurrent retries."""
    return {
        "thresholds": [
            {
                "priority": "DEFAULT",
                "max_connections": 1024,
                "max_pending_requests": 1024,
                "max_requests": max_requests,
                "retry_budget": {"budget_percent": {"value": 20.0}, "min_retry_concurrency": 5},
                "track_remaining": True,
            }
        ]
    }


def outlier_detection() -> Config:
    """Eject a replica after 3 gateway errors (gRPC UNAVAILABLE counts). The enforcing
    percentage defaults to 0 (detect, never eject), and a passing health check would
    un-eject a host that still fails real requests: both are set explicitly."""
    return {
        "consecutive_5xx": 3,
        "consecutive_gateway_failure": 3,
        "enforcing_consecutive_5xx": 100,
        "enforcing_consecutive_gateway_failure": 100,
        "interval": "1s",
        "base_ejection_time": "30s",
        "max_ejection_time": "300s",
        "max_ejection_percent": 50,
        "successful_active_health_check_uneject_host": False,
    }


def health_check(
    service: str | None, event_log: str, idle_interval: str = "5s", *, path: str | None = None
) -> Config:
    """Active check every second, grpc.health.v1 of `service` or HTTP GET of `path`; clusters
    that never had traffic every `idle_interval` (Envoy's default of 60 s would leave a late
    starter unhealthy for a minute)."""
    check: Config = (
        {"http_health_check": {"path": path}}
        if path is not None
        else {"grpc_health_check": {"service_name": service}}
    )
    return {
        "timeout": "1s",
        "interval": "1s",
        "interval_jitter": "0.1s",
        "unhealthy_threshold": 2,
        "healthy_threshold": 1,
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
    cluster: Config = {
        "name": up.name,
        "type": "STRICT_DNS" if up.dns else "STATIC",
        "connect_timeout": "0.5s",
        # P2C on in-flight requests: a slow replica gets fewer new ones.
        "lb_policy": "LEAST_REQUEST",
        "least_request_lb_config": {"choice_count": 2},
        # The default 50 % sends traffic to failing hosts once half are unhealthy.
        "common_lb_config": {"healthy_panic_threshold": {"value": 0}},
        "typed_extension_protocol_options": _protocol_options(up.http1),
        "circuit_breakers": circuit_breakers(),
        "outlier_detection": outlier_detection(),
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
            )
        ]
    if layout.mesh_tls and up.peer_identity is not None:
        cluster["transport_socket"] = upstream_tls(up.peer_identity, http1=up.http1)
    return cluster


def plain_cluster(name: str, endpoint: Endpoint, *, http1: bool = False) -> Config:
    """A single local endpoint without health checks (collector, the sidecar's own app)."""
    return {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": _protocol_options(http1),
        "circuit_breakers": circuit_breakers(),
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address(endpoint)}}]}],
        },
    }


def dns_cache_config() -> Config:
    return {"name": REPLICA_DNS_CACHE, "dns_lookup_family": "V4_ONLY", "host_ttl": "300s"}


def replica_cluster(layout: Layout, peer_identity: str | None) -> Config:
    """The replica the router chose, named in the `x-envoy-original-dst-host` header.

    No health checks or retries here: the router watches each replica's load and re-dispatches
    before the first token itself, and a hop must not be retried at two layers.
    """
    cluster: Config = {
        "name": REPLICA_CLUSTER,
        "connect_timeout": "0.5s",
        "lb_policy": "CLUSTER_PROVIDED",
        "typed_extension_protocol_options": _protocol_options(http1=False),
        "circuit_breakers": circuit_breakers(),
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
    return cluster
