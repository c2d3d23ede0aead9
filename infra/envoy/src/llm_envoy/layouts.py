"""The concrete layouts: one host (local) and a Kubernetes namespace (edge gateway, sidecars)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from llm_envoy.admin_access import ADMIN_SOCKET, K8S_ADMIN_SOCKET
from llm_envoy.policy_model import MeshPolicy
from llm_envoy.routes import (
    AUTH_ADMIN_METHODS,
    BILLING_ADMIN_METHODS,
    CACHE_ADMIN_METHODS,
    grpc_path,
)
from llm_envoy.topology import (
    ADMIN_PORT,
    AUTH_EDGE,
    AUTH_EDGE_HEALTH,
    AUTH_HTTP,
    AUTH_HTTP_HEALTH_PATH,
    AUTH_HTTP_PREFIX,
    EDGE_HTTP_PORT,
    EDGE_TLS_PORT,
    MESH_INBOUND_PORT,
    MESH_OUTBOUND_PORT,
    ROUTER_DEPENDENCIES,
    ROUTER_HTTP_PORT,
    SERVICES,
    Endpoint,
    Flavour,
    Layout,
    Peer,
    ReplicaPath,
    Upstream,
    spiffe_id,
)

LOOPBACK = "127.0.0.1"
NAMESPACE = "llm"
GATEWAY = "gateway"  # the edge's service account
OTLP_K8S = Endpoint("otel-collector.observability.svc.cluster.local", 4317)
STATS_PORT = 9902  # the sidecars' Prometheus endpoint (admin stays on loopback)
HEALTH_PREFIX = "/grpc.health.v1.Health/"


def _default_grpc_ports() -> dict[str, int]:
    return {name: info.grpc_port for name, info in SERVICES.items()}


@dataclass(frozen=True, slots=True)
class LocalPorts:
    """Ports of the one-host stack (ARCHITECTURE §9); tests move them to free ones."""

    edge_http: int = EDGE_HTTP_PORT
    edge_tls: int = EDGE_TLS_PORT
    admin: int = ADMIN_PORT
    mesh: int = MESH_OUTBOUND_PORT
    router_http: int = ROUTER_HTTP_PORT
    grpc: Mapping[str, int] = field(default_factory=_default_grpc_ports)
    inference: tuple[int, ...] = (50054, 50064)  # generation replicas Envoy balances over
    # auth's lean listener for ext_authz and rate limits (AUTH_EDGE_PORT, default 50061 where
    # the stack starts auth with it); None: Envoy calls auth's main port for them.
    auth_edge: int | None = None
    # auth's HTTP ext_authz listener (AUTH_HTTP_AUTHZ_PORT, default 50071 where the stack
    # starts auth with it); None: ext_authz is Check over gRPC.
    auth_http: int | None = None


def local_layout(
    ports: LocalPorts,
    *,
    otlp: Endpoint | None = None,
    admin_tenant: str = "system",
    listen_host: str = LOOPBACK,
    policy: MeshPolicy | None = None,
) -> Layout:
    """Edge and mesh in one Envoy next to the services, all on loopback."""

    def up(name: str, *, ports_: tuple[int, ...] | None = None) -> Upstream:
        chosen = ports_ if ports_ is not None else (ports.grpc[name],)
        return Upstream(
            name,
            tuple(Endpoint(LOOPBACK, p) for p in chosen),
            health_service=SERVICES[name].grpc_service,
        )

    upstreams = {name: up(name) for name in ("auth", "tokenizer", "router", "cache", "billing")}
    upstreams["inference"] = up("inference", ports_=ports.inference)
    upstreams["router_http"] = Upstream(
        "router_http", (Endpoint(LOOPBACK, ports.router_http),), http1=True
    )
    if ports.auth_edge is not None:
        upstreams[AUTH_EDGE] = Upstream(
            AUTH_EDGE, (Endpoint(LOOPBACK, ports.auth_edge),), health_service=AUTH_EDGE_HEALTH
        )
    if ports.auth_http is not None:
        upstreams[AUTH_HTTP] = Upstream(
            AUTH_HTTP,
            (Endpoint(LOOPBACK, ports.auth_http),),
            http1=True,
            health_path=AUTH_HTTP_HEALTH_PATH,
        )
    return Layout(
        flavour=Flavour.LOCAL,
        upstreams=upstreams,
        admin=Endpoint(LOOPBACK, ports.admin),
        listen_host=listen_host,
        edge_http_port=ports.edge_http,
        edge_tls_port=ports.edge_tls,
        mesh_outbound=Endpoint(LOOPBACK, ports.mesh),
        replica_path=ReplicaPath.ORIGINAL_DST,
        otlp=None if otlp is None else Upstream("otel_collector", (otlp,)),
        admin_tenant=admin_tenant,
        # Processes start one after another on one host: a late one is seen within a second.
        health_idle_interval="1s",
        policy=policy or MeshPolicy(),
        # The host's loopback is everyone's: the admin on a socket, readers on ports.admin.
        admin_socket=ADMIN_SOCKET,
    )


# HTTP upstreams reached through a service's sidecar: the service they belong to.
_HTTP_UPSTREAM_SERVICE = {"router_http": "router", AUTH_HTTP: "auth"}


def k8s_upstream(name: str, namespace: str = NAMESPACE, *, http1: bool = False) -> Upstream:
    """A service's pods through their sidecars (headless Service: Envoy balances per request)."""
    service = _HTTP_UPSTREAM_SERVICE.get(name, name)
    host = f"{service}.{namespace}.svc.cluster.local"
    return Upstream(
        name,
        (Endpoint(host, MESH_INBOUND_PORT),),
        health_service=None if http1 else SERVICES[service].grpc_service,
        health_path=AUTH_HTTP_HEALTH_PATH if name == AUTH_HTTP else None,
        http1=http1,
        dns=True,
        peer_identity=spiffe_id(namespace, service),
    )


def _k8s_layout(
    upstreams: dict[str, Upstream],
    service_name: str,
    *,
    outbound: bool,
    admin_tenant: str,
    policy: MeshPolicy,
    admin_socket: str | None = K8S_ADMIN_SOCKET,
) -> Layout:
    return Layout(
        flavour=Flavour.K8S,
        upstreams=upstreams,
        admin=Endpoint(LOOPBACK, ADMIN_PORT),
        listen_host="0.0.0.0",
        mesh_outbound=Endpoint(LOOPBACK, MESH_OUTBOUND_PORT) if outbound else None,
        replica_path=ReplicaPath.DYNAMIC_DNS,
        otlp=Upstream("otel_collector", (OTLP_K8S,), dns=True),
        admin_tenant=admin_tenant,
        health_event_log="/dev/stdout",
        service_name=service_name,
        mesh_tls=True,
        policy=policy,
        admin_socket=admin_socket,
    )


def k8s_edge_layout(
    namespace: str = NAMESPACE, admin_tenant: str = "system", policy: MeshPolicy | None = None
) -> Layout:
    """The gateway Deployment: public listeners, mTLS to the services' sidecars."""
    upstreams = {n: k8s_upstream(n, namespace) for n in ("router", "auth", "billing", "cache")}
    upstreams["router_http"] = k8s_upstream("router_http", namespace, http1=True)
    # ext_authz on auth's HTTP listener (through auth's sidecar); rate limits on its main port.
    upstreams[AUTH_HTTP] = k8s_upstream(AUTH_HTTP, namespace, http1=True)
    return _k8s_layout(
        upstreams,
        "llm-edge",
        outbound=False,
        admin_tenant=admin_tenant,
        policy=policy or MeshPolicy(),
        # The gateway pod holds only Envoy: its loopback is its own, and the preStop hook
        # posts /healthcheck/fail there with the image's wget.
        admin_socket=None,
    )


def k8s_sidecar_layout(
    service: str, namespace: str = NAMESPACE, policy: MeshPolicy | None = None
) -> Layout:
    """A service pod's sidecar; only the router's has an outbound side."""
    upstreams: dict[str, Upstream] = {}
    if service == "router":
        names = (*ROUTER_DEPENDENCIES, "inference")
        upstreams = {n: k8s_upstream(n, namespace) for n in names}
    return _k8s_layout(
        upstreams,
        f"llm-{service}",
        outbound=service == "router",
        admin_tenant="system",
        policy=policy or MeshPolicy(),
    )


def k8s_peers(service: str, namespace: str = NAMESPACE) -> dict[str, Peer]:
    """Who may call `service` through its sidecar (the admin surface only from the gateway)."""
    gateway = spiffe_id(namespace, GATEWAY)
    router = spiffe_id(namespace, "router")
    if service == "router":
        return {"gateway": Peer(gateway)}
    if service == "auth":
        auth = SERVICES["auth"].grpc_service
        edge_paths = (
            "/envoy.service.auth.v3.Authorization/",
            "/envoy.service.ratelimit.v3.RateLimitService/",
            AUTH_HTTP_PREFIX,
            AUTH_HTTP_HEALTH_PATH,
            HEALTH_PREFIX,
            *(grpc_path(auth, m) for m in AUTH_ADMIN_METHODS),
        )
        return {"router": Peer(router), "gateway": Peer(gateway, edge_paths)}
    admin_methods = {"billing": BILLING_ADMIN_METHODS, "cache": CACHE_ADMIN_METHODS}
    peers = {"router": Peer(router)}
    if service in admin_methods:
        full = SERVICES[service].grpc_service
        paths = [grpc_path(full, m.name) for m in admin_methods[service]]
        if service == "billing":
            paths.append(grpc_path(full, "ListPrices"))
        peers["gateway"] = Peer(gateway, (HEALTH_PREFIX, *paths))
    return peers
