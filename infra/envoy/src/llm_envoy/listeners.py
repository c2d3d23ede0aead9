"""Listeners: the edge (plaintext and TLS), the mesh's outbound and inbound sides, stats."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from llm_envoy import admin_access, filters
from llm_envoy.body_limits import too_large_replies
from llm_envoy.clusters import ADMIN_CLUSTER, address
from llm_envoy.local_bucket import bucket_reply
from llm_envoy.policy_model import Limits, LocalRateLimit
from llm_envoy.routes import edge_routes, mesh_routes
from llm_envoy.topology import (
    AUTH_HTTP_HEALTH_PATH,
    AUTH_HTTP_PREFIX,
    EDGE_CERT,
    EDGE_KEY,
    MESH_CA,
    MESH_CERT,
    MESH_KEY,
    SPIFFE_TRUST_DOMAIN,
    Endpoint,
    Layout,
    Peer,
    ReplicaPath,
)

Config = dict[str, Any]
HCM = "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
LOCAL_APP = "local_app"
LOCAL_APP_HTTP = "local_app_http"
LOCAL_AUTHZ_HTTP = "local_authz_http"  # auth's HTTP ext_authz listener, behind auth's sidecar
# Upstream failures Envoy answers itself; ext_authz denials (UAEX) keep auth's own body.
_UPSTREAM_FAILURE_FLAGS = ["UH", "UF", "UO", "URX", "UT", "UC", "UPE", "UMSDR", "NR", "DT"]


def _listener(name: str, endpoint: Endpoint, hcm: Config, tls: Config | None = None) -> Config:
    chain: Config = {
        "filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]
    }
    if tls is not None:
        chain["transport_socket"] = tls
    return {"name": name, "address": address(endpoint), "filter_chains": [chain]}


def _downstream_tls(cert: str, key: str, *, client_ca: str | None = None) -> Config:
    common: Config = {
        # gRPC clients need h2 negotiated through ALPN.
        "alpn_protocols": ["h2", "http/1.1"],
        "tls_params": {"tls_minimum_protocol_version": "TLSv1_2"},
        "tls_certificates": [
            {"certificate_chain": {"filename": cert}, "private_key": {"filename": key}}
        ],
    }
    context: Config = {"common_tls_context": common}
    if client_ca is not None:
        context["require_client_certificate"] = True
        common["validation_context"] = {
            "trusted_ca": {"filename": client_ca},
            "match_typed_subject_alt_names": [
                {"san_type": "URI", "matcher": {"prefix": f"spiffe://{SPIFFE_TRUST_DOMAIN}/"}}
            ],
        }
    return {
        "name": "envoy.transport_sockets.tls",
        "typed_config": filters.typed(
            "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext", **context
        ),
    }


def _hcm(
    stat_prefix: str, routes: list[Config], http_filters: list[Config], **extra: Any
) -> Config:
    return filters.typed(
        HCM,
        stat_prefix=stat_prefix,
        codec_type="AUTO",
        stream_idle_timeout="300s",
        request_timeout="0s",  # would cap the time to receive a whole (streamed) request
        drain_timeout="5s",
        common_http_protocol_options={
            "idle_timeout": "3600s",
            "headers_with_underscores_action": "REJECT_REQUEST",
        },
        http2_protocol_options={"max_concurrent_streams": 1000},
        route_config={
            "name": stat_prefix,
            "virtual_hosts": [
                {
                    "name": stat_prefix,
                    "domains": ["*"],
                    "include_request_attempt_count": True,
                    "routes": routes,
                }
            ],
        },
        http_filters=http_filters,
        **extra,
    )


def _openai_error(status_filter: Config, body: Config) -> Config:
    on_v1 = {"header_filter": {"header": {"name": ":path", "string_match": {"prefix": "/v1/"}}}}
    return {
        "filter": {"and_filter": {"filters": [on_v1, status_filter]}},
        "body_format_override": {"json_format": body, "content_type": "application/json"},
    }


def openai_local_replies(
    limits: Limits | None = None, bucket: LocalRateLimit | None = None
) -> Config:
    """Envoy's own answers on /v1/ in OpenAI's error shape, so its clients can read them;
    413 for an oversized body in each protocol's shape (llm_envoy.body_limits)."""

    def status(value: int) -> Config:
        return {
            "status_code_filter": {
                "comparison": {
                    "op": "EQ",
                    "value": {"default_value": value, "runtime_key": f"edge.openai_{value}"},
                }
            }
        }

    rate_limited = {
        "error": {
            "message": "Rate limit reached for this API key; retry later.",
            "type": "rate_limit_error",
            "param": None,  # OpenAI's error object always has the four keys
            "code": "rate_limit_exceeded",
        }
    }
    unavailable = {
        "error": {
            "message": "The service is unavailable (%RESPONSE_CODE_DETAILS%); retry later.",
            "type": "server_error",
            "param": None,
            "code": "service_unavailable",
        }
    }
    upstream_failed = {"response_flag_filter": {"flags": _UPSTREAM_FAILURE_FLAGS}}
    return {
        "mappers": [
            *too_large_replies(limits or Limits()),
            _openai_error(status(429), rate_limited),
            _openai_error(upstream_failed, unavailable),
            *bucket_reply(bucket),
        ]
    }


def _tracing(layout: Layout, service_name: str) -> Config:
    return {} if layout.otlp is None else {"tracing": filters.tracing(service_name)}


def edge_listeners(layout: Layout) -> list[Config]:
    """Plaintext (h2c and HTTP/1.1) and TLS listeners with the same routes and filters."""
    listeners = []
    for name, port, tls in (
        ("edge_http", layout.edge_http_port, None),
        ("edge_https", layout.edge_tls_port, _downstream_tls(EDGE_CERT, EDGE_KEY)),
    ):
        edge = layout.policy.edge
        targets = filters.AuthTargets.of(layout.upstreams, edge.ext_authz)
        hcm = _hcm(
            name,
            edge_routes(layout),
            filters.edge_filters(targets, edge),
            use_remote_address=True,
            generate_request_id=True,
            preserve_external_request_id=False,
            always_set_request_id_in_response=True,
            max_request_headers_kb=edge.limits.max_request_headers_kb,
            normalize_path=True,
            merge_slashes=True,
            access_log=filters.access_log(name),
            local_reply_config=openai_local_replies(edge.limits, edge.local_rate_limit),
            **_tracing(layout, layout.service_name),
        )
        listener = _listener(name, Endpoint(layout.listen_host, port), hcm, tls)
        if edge.limits.listener_buffer_limit_bytes is not None:
            listener["per_connection_buffer_limit_bytes"] = edge.limits.listener_buffer_limit_bytes
        listeners.append(listener)
    return listeners


def _failures_only_log(name: str) -> list[Config]:
    logs = filters.access_log(name)
    logs[0]["filter"] = {"grpc_status_filter": {"statuses": ["OK"], "exclude": True}}
    return logs


def mesh_outbound_listener(layout: Layout) -> Config:
    """Where the router reaches its dependencies and the inference replicas (loopback)."""
    assert layout.mesh_outbound is not None
    http_filters = [filters.router_filter()]
    if layout.replica_path is ReplicaPath.DYNAMIC_DNS:
        http_filters.insert(0, filters.dynamic_forward_proxy_filter())
    hcm = _hcm(
        "mesh",
        mesh_routes(layout),
        http_filters,
        generate_request_id=True,
        preserve_external_request_id=True,
        access_log=_failures_only_log("mesh"),
        **_tracing(layout, f"{layout.service_name}-mesh"),
    )
    return _listener("mesh_outbound", layout.mesh_outbound, hcm)


def inbound_listener(
    layout: Layout,
    port: int,
    peers: Mapping[str, Peer],
    *,
    http_app: bool,
    http_authz: bool = False,
) -> Config:
    """A pod's mTLS entry: only the mesh peers named in `peers` reach the local app (and
    its HTTP listeners: the router's OpenAI API, auth's HTTP ext_authz)."""
    routes: list[Config] = []
    if http_app:
        routes.append(
            {"match": {"prefix": "/v1/"}, "route": {"cluster": LOCAL_APP_HTTP, "timeout": "0s"}}
        )
    if http_authz:
        for match in ({"prefix": AUTH_HTTP_PREFIX}, {"path": AUTH_HTTP_HEALTH_PATH}):
            routes.append({"match": match, "route": {"cluster": LOCAL_AUTHZ_HTTP, "timeout": "1s"}})
    routes.append({"match": {"prefix": "/"}, "route": {"cluster": LOCAL_APP, "timeout": "0s"}})
    http_filters = [filters.rbac_filter(peer_rules(peers)), filters.router_filter()]
    hcm = _hcm(
        "inbound",
        routes,
        http_filters,
        forward_client_cert_details="SANITIZE_SET",
        set_current_client_cert_details={"uri": True},
        access_log=_failures_only_log("inbound"),
        **_tracing(layout, f"{layout.service_name}-inbound"),
    )
    tls = _downstream_tls(MESH_CERT, MESH_KEY, client_ca=MESH_CA)
    return _listener("mesh_inbound", Endpoint("0.0.0.0", port), hcm, tls)


def peer_rules(peers: Mapping[str, Peer]) -> Config:
    """RBAC ALLOW rules: each peer's certificate identity, optionally limited to paths."""
    policies: Config = {}
    for name, peer in peers.items():
        permissions: list[Config] = [{"any": True}]
        if peer.path_prefixes:
            prefixes = [{"url_path": {"path": {"prefix": p}}} for p in peer.path_prefixes]
            permissions = [{"or_rules": {"rules": prefixes}}]
        principal = {"authenticated": {"principal_name": {"exact": peer.identity}}}
        policies[name] = {"permissions": permissions, "principals": [principal]}
    return {"action": "ALLOW", "policies": policies}


def stats_listener(port: int) -> Config:
    """Prometheus (GET /stats/prometheus) and probes (GET /ready) reach the admin here; the
    admin itself stays on its socket or loopback (llm_envoy.admin_access)."""
    routes = admin_access.read_only_routes(ADMIN_CLUSTER, admin_access.STATS_PATHS)
    hcm = _hcm("stats", routes, [filters.router_filter()])
    return _listener("stats", Endpoint("0.0.0.0", port), hcm)


def admin_read_listener(endpoint: Endpoint) -> Config:
    """Loopback, where the admin was: the read-only endpoints for mesh-show/status/apply,
    probes and Prometheus; nothing that changes or stops Envoy."""
    routes = admin_access.read_only_routes(ADMIN_CLUSTER, admin_access.READ_ONLY_PATHS)
    hcm = _hcm("admin_read", routes, [filters.router_filter()])
    return _listener("admin_read", endpoint, hcm)
