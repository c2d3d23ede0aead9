"""Who talks to whom: the services, their ports, and the two deployment flavours' layouts."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from llm_envoy.policy_model import MeshPolicy

# Files Envoy opens, relative to its working directory (the run directory locally,
# /etc/envoy in Kubernetes); validation opens them too.
CERT_DIR = "certs"
EDGE_CERT = f"{CERT_DIR}/edge.crt"
EDGE_KEY = f"{CERT_DIR}/edge.key"
MESH_CA = f"{CERT_DIR}/ca.crt"
MESH_CERT = f"{CERT_DIR}/mesh.crt"
MESH_KEY = f"{CERT_DIR}/mesh.key"
DESCRIPTOR = "proto/llm.pb"
LOG_DIR = "logs"

LLM_SERVICE = "llmapi.llm.v1.LLMService"
REPLICA_HEADER = "x-envoy-original-dst-host"  # the router names its chosen replica here
SPIFFE_TRUST_DOMAIN = "llm.local"


@dataclass(frozen=True, slots=True)
class ServiceInfo:
    """A platform service as the mesh sees it."""

    name: str
    grpc_service: str  # the full name its health check asks for
    grpc_port: int
    metrics_port: int


SERVICES: Mapping[str, ServiceInfo] = {
    s.name: s
    for s in (
        ServiceInfo("auth", "llmapi.auth.v1.AuthService", 50051, 9151),
        ServiceInfo("tokenizer", "llmapi.tokenizer.v1.TokenizerService", 50052, 9152),
        ServiceInfo("router", LLM_SERVICE, 50053, 9153),
        ServiceInfo("inference", "llmapi.inference.v1.InferenceService", 50054, 9154),
        ServiceInfo("cache", "llmapi.cache.v1.CacheService", 50055, 9155),
        ServiceInfo("billing", "llmapi.billing.v1.BillingService", 50056, 9156),
    )
}
# The router's OpenAI-compatible HTTP/1.1 listener (ROUTER_HTTP_PORT).
ROUTER_HTTP_PORT = 8053
EDGE_HTTP_PORT = 8080
EDGE_TLS_PORT = 8443
ADMIN_PORT = 9901
MESH_OUTBOUND_PORT = 15001  # a pod's own services call the mesh here (loopback only)
MESH_INBOUND_PORT = 15006  # peers reach a pod's sidecar here (mTLS)
# Services the router calls through the mesh (inference is reached per replica).
ROUTER_DEPENDENCIES = ("tokenizer", "cache", "billing", "auth")
# auth's lean listener for Envoy's per-request ext_authz and rate-limit calls (AUTH_EDGE_PORT).
AUTH_EDGE = "auth_edge"
AUTH_EDGE_PORT = 50061
AUTH_EDGE_HEALTH = "envoy.service.auth.v3.Authorization"
# auth's HTTP/1.1 ext_authz listener (AUTH_HTTP_AUTHZ_PORT, llm_auth.http_authz): the same
# decision as Check at about half the added latency, so Envoy uses it where a layout has it.
AUTH_HTTP = "auth_http"
AUTH_HTTP_PORT = 50071
AUTH_HTTP_PREFIX = "/authz"  # check path = prefix [+ ";scopes=a,b"] + the original path
AUTH_HTTP_HEALTH_PATH = "/healthz"  # the listener's own probe, whatever the public paths are


class Flavour(enum.Enum):
    """Where the configuration runs."""

    LOCAL = "local"  # one Envoy process beside the services on one host
    K8S = "k8s"  # an edge gateway Deployment and one sidecar per service pod


class ReplicaPath(enum.Enum):
    """How the mesh reaches the inference replica the router chose."""

    # ORIGINAL_DST cluster: the header holds ip:port (local; addresses are IPs).
    ORIGINAL_DST = "original_dst"
    # Dynamic forward proxy: the header holds host:port and Envoy resolves it (Kubernetes
    # StatefulSet pod names).
    DYNAMIC_DNS = "dynamic_dns"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A host and port."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Upstream:
    """One cluster: a service at these endpoints."""

    name: str
    endpoints: tuple[Endpoint, ...]
    health_service: str | None = None  # gRPC health-checked service; None: no active check
    health_path: str | None = None  # HTTP/1.1 health-check path (http1 upstreams)
    http1: bool = False  # HTTP/1.1 upstream (the OpenAI listener); otherwise h2c gRPC
    dns: bool = False  # STRICT_DNS (Kubernetes) instead of STATIC addresses
    peer_identity: str | None = None  # SPIFFE id the peer's certificate must carry (mTLS)


@dataclass(frozen=True, slots=True)
class Peer:
    """A mesh workload allowed to call a service, by its certificate's SPIFFE id."""

    identity: str
    path_prefixes: tuple[str, ...] = ()  # empty: every path


@dataclass(frozen=True, slots=True)
class Layout:
    """Everything a rendered config depends on."""

    flavour: Flavour
    upstreams: Mapping[str, Upstream]
    admin: Endpoint  # the admin, or its read-only listener when the admin is on a socket
    listen_host: str = "127.0.0.1"
    edge_http_port: int = EDGE_HTTP_PORT
    edge_tls_port: int = EDGE_TLS_PORT
    mesh_outbound: Endpoint | None = None  # the mesh listener the router calls
    replica_path: ReplicaPath = ReplicaPath.ORIGINAL_DST
    otlp: Upstream | None = None  # trace collector (OTLP/gRPC); None: no tracing
    admin_tenant: str = "system"  # tenant whose admins may use the admin routes
    health_event_log: str = f"{LOG_DIR}/health_events.log"
    health_idle_interval: str = "5s"  # health checks of clusters that had no traffic yet
    service_name: str = "llm-edge"  # as spans and logs name this Envoy
    mesh_tls: bool = False  # mTLS to peers (Kubernetes)
    policy: MeshPolicy = field(default_factory=MeshPolicy)  # the operator's tunables
    admin_socket: str | None = None  # the admin's unix socket (llm_envoy.admin_access)


def spiffe_id(namespace: str, service_account: str) -> str:
    """The SPIFFE id a workload's mesh certificate carries."""
    return f"spiffe://{SPIFFE_TRUST_DOMAIN}/ns/{namespace}/sa/{service_account}"
