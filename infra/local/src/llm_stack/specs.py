"""The processes of the stack: each service's command and environment, and Envoy's."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from llm_common.grpc_runtime import with_grpc_runtime
from llm_envoy.layouts import LocalPorts
from llm_envoy.topology import SERVICES
from llm_envoy.validate import envoy_binary
from llm_stack.catalogue import LocalReplica
from llm_stack.config import StackConfig
from llm_stack.credentials import Credentials
from llm_stack.mesh_pki import MeshPki
from llm_stack.process import ProcessSpec
from llm_stack.redis_users import StackRedisUsers

# Inherited variables that would change how a service behaves are not passed on.
# REDIS_URL carries the stack's Redis (a cluster as redis+cluster://, credentials inside).
_DROPPED = (
    "GRPC_PORT", "METRICS_PORT", "OTEL_EXPORTER_OTLP_ENDPOINT", "REDIS_URL",
    "REDIS_CLUSTER_NODES", "REDIS_USERNAME", "REDIS_PASSWORD", "REDIS_TLS_CA_CERT",
    "GRPC_TLS_CERT_FILE", "GRPC_TLS_KEY_FILE", "GRPC_TLS_CLIENT_CA_FILE",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Shared:
    """What every service spec needs."""

    config: StackConfig
    redis_url: str
    models_config: Path  # the run directory's copy, with the bound replica ports
    credentials: Credentials
    redis_users: StackRedisUsers | None = None  # the stack's own Redis: one user per service
    mesh_pki: MeshPki | None = None  # MESH_MTLS=1: each process's certificate

    @property
    def mesh(self) -> str:
        return f"127.0.0.1:{self.config.ports.envoy.mesh}"

    def redis_env(self, service: str) -> dict[str, str]:
        """REDIS_URL for `service`: with its own user on the stack's Redis, else as given."""
        users = self.redis_users
        url = self.redis_url if users is None else users.url_for(self.redis_url, service)
        return {"REDIS_URL": url}


def base_env(config: StackConfig) -> dict[str, str]:
    env = with_grpc_runtime({k: v for k, v in os.environ.items() if k not in _DROPPED})
    env |= {"PYTHONUNBUFFERED": "1", "LOG_LEVEL": config.log_level}
    # Services listen on loopback only: their ports trust the identity headers the edge adds,
    # so only the edge (LLM_LISTEN_HOST) may face the network. An explicit BIND_HOST wins.
    env.setdefault("BIND_HOST", "127.0.0.1")
    if config.otlp is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://{config.otlp}"
    return env


def _service(
    shared: Shared, name: str, module: str, grpc_port: int, extra: Mapping[str, str]
) -> ProcessSpec:
    c = shared.config
    metrics_port = c.ports.metrics_port(name, grpc_port)
    env = base_env(c) | {"GRPC_PORT": str(grpc_port), "METRICS_PORT": str(metrics_port)}
    env |= {"MODELS_CONFIG": str(shared.models_config), "MODEL_ROOT": str(c.model_root)}
    env |= dict(extra)
    service = "inference" if module == "llm_inference" else name
    if shared.mesh_pki is not None:
        env |= shared.mesh_pki.env_for(service)
    return ProcessSpec(
        name=name,
        argv=[sys.executable, "-m", module],
        env=env,
        cwd=c.root,
        log=c.run_dir / "logs" / f"{name}.log",
        grpc_port=grpc_port,
        metrics_port=metrics_port,
        health_service=SERVICES[service].grpc_service,
    )


def _auth_listeners(ports: LocalPorts) -> dict[str, str]:
    """auth's listeners for Envoy's per-request calls, where the plan has them."""
    env = {}
    if ports.auth_edge is not None:
        env["AUTH_EDGE_PORT"] = str(ports.auth_edge)
    if ports.auth_http is not None:
        env["AUTH_HTTP_AUTHZ_PORT"] = str(ports.auth_http)
    return env


def billing_database_url(config: StackConfig) -> str:
    """Billing's usage store: BILLING_DATABASE_URL when set (e.g. a PostgreSQL), else SQLite
    (WAL) in the run directory."""
    url = os.environ.get("BILLING_DATABASE_URL", "").strip()
    return url or f"sqlite:///{config.run_dir / 'billing' / 'usage.db'}"


def core_specs(shared: Shared) -> list[ProcessSpec]:
    """auth, tokenizer, cache, billing and the router (which reaches them through the mesh)."""
    c, prefix = shared.config, shared.config.redis_prefix
    grpc = c.ports.envoy.grpc
    extra: dict[str, dict[str, str]] = {
        "auth": shared.redis_env("auth")
        | {
            "AUTH_PEPPER_FILE": str(shared.credentials.pepper_file),
            "AUTH_BOOTSTRAP_ADMIN_KEY_FILE": str(shared.credentials.admin_key_file),
            "AUTH_ADMIN_TENANT": c.admin_tenant,
            "AUTH_REDIS_PREFIX": f"{prefix}auth:",
        }
        | _auth_listeners(c.ports.envoy),
        "tokenizer": {},
        # One encoder thread: the host's cores are shared by every process of the stack.
        "cache": shared.redis_env("cache")
        | {"CACHE_KEY_PREFIX": f"{prefix}llmcache:", "CACHE_ENCODER_THREADS": "1"}
        | {"CACHE_MASTER_KEY_FILE": str(shared.credentials.cache_master_key_file)}
        | {"OMP_NUM_THREADS": "1"},
        "billing": shared.redis_env("billing")
        | {"PRICES_CONFIG": str(c.prices_config), "BILLING_KEY_PREFIX": f"{prefix}billing:"}
        | {"BILLING_DATABASE_URL": billing_database_url(c)},
        "router": {
            "TOKENIZER_SERVICE_ADDR": shared.mesh,
            "CACHE_SERVICE_ADDR": shared.mesh,
            "BILLING_SERVICE_ADDR": shared.mesh,
            "AUTH_SERVICE_ADDR": shared.mesh,
            "INFERENCE_MESH_ADDR": shared.mesh,
            "ROUTER_CHANNEL_RETRIES": "false",  # the mesh retries; never one hop at two layers
            "ROUTER_POLICIES": str(c.policies_config),
            "ROUTER_OUTBOX_DIR": str(c.run_dir / "router-outbox"),
            "ROUTER_HTTP_PORT": str(c.ports.envoy.router_http),
        },
    }
    return [_service(shared, name, f"llm_{name}", grpc[name], extra[name]) for name in extra]


def replica_spec(shared: Shared, replica: LocalReplica) -> ProcessSpec:
    """One inference process; torch gets one thread, as replicas share the host's cores."""
    port = shared.config.ports.replica_port(replica.port)
    extra = {
        "INFERENCE_MODEL": replica.model,
        "REPLICA_ID": f"127.0.0.1:{port}",
        "OMP_NUM_THREADS": "1",
    }
    return _service(shared, replica.name, "llm_inference", port, extra)


def envoy_spec(config: StackConfig, workdir: Path) -> ProcessSpec:
    """Envoy in its working directory (certs/, proto/, logs/ beside envoy.yaml)."""
    argv = [
        str(envoy_binary()),
        "-c", "envoy.yaml",
        "--disable-hot-restart",
        "--log-level", "warn",
        "--drain-time-s", "2",
        "--concurrency", "2",
    ]  # fmt: skip
    return ProcessSpec(
        name="envoy",
        argv=argv,
        env=base_env(config),
        cwd=workdir,
        log=config.run_dir / "logs" / "envoy.log",
        grace_s=10.0,
    )
