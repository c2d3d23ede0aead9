"""Whole Envoy bootstrap configs: local (edge + mesh in one), Kubernetes edge and sidecars."""

from __future__ import annotations

from typing import Any

import yaml

from llm_envoy import admin_access, clusters, filters, layouts, listeners
from llm_envoy.policy_model import MeshPolicy
from llm_envoy.topology import (
    AUTH_HTTP_PORT,
    MESH_INBOUND_PORT,
    ROUTER_HTTP_PORT,
    SERVICES,
    Endpoint,
    Layout,
)

Config = dict[str, Any]
MAX_DOWNSTREAM_CONNECTIONS = 50_000


def _bootstrap(
    layout: Layout, node: str, listener_list: list[Config], cluster_list: list[Config]
) -> Config:
    static: Config = {}
    if layout.otlp is not None:
        static = filters.tracing_runtime()
        cluster_list.append(_otlp_cluster(layout))
    return {
        "node": {"id": node, "cluster": node},
        "admin": {
            # Never public: the admin can drain and kill the proxy (llm_envoy.admin_access).
            "address": admin_access.admin_address(layout.admin, layout.admin_socket),
            "access_log": [
                {
                    "name": "envoy.access_loggers.file",
                    "typed_config": filters.typed(
                        "envoy.extensions.access_loggers.file.v3.FileAccessLog", path="/dev/null"
                    ),
                }
            ],
        },
        "layered_runtime": {
            "layers": [
                {"name": "static", "static_layer": static},
                {"name": "admin", "admin_layer": {}},
            ]
        },
        "overload_manager": {
            "resource_monitors": [
                {
                    "name": "envoy.resource_monitors.global_downstream_max_connections",
                    "typed_config": filters.typed(
                        "envoy.extensions.resource_monitors.downstream_connections.v3"
                        ".DownstreamConnectionsConfig",
                        max_active_downstream_connections=MAX_DOWNSTREAM_CONNECTIONS,
                    ),
                }
            ]
        },
        "static_resources": {"listeners": listener_list, "clusters": cluster_list},
    }


def _otlp_cluster(layout: Layout) -> Config:
    assert layout.otlp is not None
    up = layout.otlp
    cluster = clusters.plain_cluster(up.name, up.endpoints[0], layout.policy.cluster(up.name))
    if up.dns:
        cluster["type"] = "STRICT_DNS"
        cluster["dns_lookup_family"] = "V4_ONLY"
    return cluster


def _service_clusters(layout: Layout) -> list[Config]:
    return [clusters.service_cluster(up, layout) for up in layout.upstreams.values()]


def local_config(layout: Layout) -> Config:
    """One Envoy for the one-host stack: edge listeners, the mesh listener and every cluster."""
    listener_list = [*listeners.edge_listeners(layout), listeners.mesh_outbound_listener(layout)]
    cluster_list = _service_clusters(layout)
    cluster_list.append(clusters.replica_cluster(layout, peer_identity=None))
    if layout.admin_socket is not None:
        listener_list.append(listeners.admin_read_listener(layout.admin))
        cluster_list.append(_admin_cluster(layout))
    return _bootstrap(layout, "llm-local", listener_list, cluster_list)


def k8s_edge_config(layout: Layout) -> Config:
    """The gateway: public listeners, mTLS to the sidecars, Prometheus stats listener."""
    listener_list = [
        *listeners.edge_listeners(layout),
        listeners.stats_listener(layouts.STATS_PORT),
    ]
    cluster_list = [*_service_clusters(layout), _admin_cluster(layout)]
    return _bootstrap(layout, "llm-edge", listener_list, cluster_list)


def k8s_sidecar_config(
    service: str, namespace: str = layouts.NAMESPACE, policy: MeshPolicy | None = None
) -> Config:
    """A service pod's sidecar: mTLS inbound to the app; the router's also has the outbound
    mesh listener with its dependencies and the chosen-replica path."""
    layout = layouts.k8s_sidecar_layout(service, namespace, policy or MeshPolicy())
    info = SERVICES[service]
    inbound = listeners.inbound_listener(
        layout,
        MESH_INBOUND_PORT,
        layouts.k8s_peers(service, namespace),
        http_app=service == "router",
        http_authz=service == "auth",
    )
    listener_list = [inbound, listeners.stats_listener(layouts.STATS_PORT)]
    cluster_list = [
        _plain(layout, listeners.LOCAL_APP, info.grpc_port),
        _admin_cluster(layout),
    ]
    if service == "auth":
        cluster_list.append(_plain(layout, listeners.LOCAL_AUTHZ_HTTP, AUTH_HTTP_PORT, http1=True))
    if service == "router":
        cluster_list.append(_plain(layout, listeners.LOCAL_APP_HTTP, ROUTER_HTTP_PORT, http1=True))
        listener_list.append(listeners.mesh_outbound_listener(layout))
        cluster_list.extend(_service_clusters(layout))
        identity = layout.upstreams["inference"].peer_identity
        cluster_list.append(clusters.replica_cluster(layout, peer_identity=identity))
    return _bootstrap(layout, f"llm-{service}", listener_list, cluster_list)


def _plain(layout: Layout, name: str, port: int, *, http1: bool = False) -> Config:
    endpoint = Endpoint(layouts.LOOPBACK, port)
    return clusters.plain_cluster(name, endpoint, layout.policy.cluster(name), http1=http1)


def _admin_cluster(layout: Layout) -> Config:
    """The admin as an upstream of the read-only listeners: its socket, or loopback."""
    name = clusters.ADMIN_CLUSTER
    cluster = clusters.plain_cluster(name, layout.admin, layout.policy.cluster(name), http1=True)
    if layout.admin_socket is not None:
        (endpoint,) = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
        endpoint["endpoint"]["address"] = {"pipe": {"path": layout.admin_socket}}
    return cluster


def to_yaml(config: Config, header: str) -> str:
    """YAML with a comment header naming where the file comes from."""
    lines = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return lines + yaml.safe_dump(config, sort_keys=False, width=100, default_flow_style=False)
