"""A whole platform per chaos session, started by the `make up` supervisor's Stack on free ports
with a Redis of its own (so it can be restarted), kept as a Stack object so the scenarios can
kill (SIGKILL), freeze (SIGSTOP), thaw and restart its processes, or restart one with
LLM_FAULTS set. Run by `make test-chaos` (`pytest -m chaos`); skipped otherwise.

Scenarios (issue 9): replica killed under streaming load (test_replica_kill) or frozen
(test_replica_freeze); billing down for 60 s (test_billing_down); Redis restarted
(test_redis_restart); a slow tokenizer (test_slow_tokenizer); the cache failing half its calls
or frozen (test_cache_faults). Each records its figures in bench/results/resilience.json under
"scenarios"."""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = (
    "llm_auth",
    "llm_tokenizer",
    "llm_router",
    "llm_inference",
    "llm_cache",
    "llm_billing",
    "llm_stack",
    "llm_envoy",
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "chaos: fault-injection scenarios on a whole local stack")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Minutes of killing and restarting a stack: only when asked for by name (`-m chaos`),
    # never as part of a plain or `-m "not gpu"` run.
    if "chaos" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="chaos scenarios run only with -m chaos (make test-chaos)")
    for item in items:
        if item.get_closest_marker("chaos") is not None:
            item.add_marker(skip)


MESH_CLUSTERS = ("auth", "tokenizer", "cache", "billing", "inference", "router")


@dataclass(frozen=True)
class ChaosStack:
    """The started platform, its processes by name, and a demo key."""

    stack: Any  # llm_stack.stack.Stack
    admin_key: str
    demo_key: str

    @property
    def edge(self) -> str:
        edge: str = self.stack.endpoints.edge_http
        return edge

    def process(self, name: str) -> Any:
        """The ManagedProcess called `name` (e.g. "replica-50064", "billing")."""
        for process in self.stack.processes():
            if process.spec.name == name:
                return process
        raise KeyError(name)

    def metrics(self, name: str) -> str:
        """host:port of the process's Prometheus endpoint."""
        address: str = self.stack.endpoints.metrics[name]
        return address

    def create_key(self, **kwargs: Any) -> str:
        from llm_stack.demo import create_key

        return create_key(self.edge, self.admin_key, **kwargs)

    def wait_serving(self, name: str, timeout_s: float = 120.0) -> None:
        """Until the process answers SERVING on its own port (not through Envoy)."""
        from llm_stack import probes

        process = self.process(name)
        target = f"127.0.0.1:{process.spec.grpc_port}"
        probes.wait_until(
            name,
            lambda: probes.grpc_serving(target, process.spec.health_service),
            timeout_s,
            lambda: None if process.alive() else f"exited:\n{process.log_tail()}",
        )

    def wait_envoy_healthy(self, cluster: str, timeout_s: float = 30.0) -> None:
        """Until Envoy's health checks count every host of `cluster` healthy again."""
        from llm_stack import probes

        admin = self.stack.endpoints.admin
        probes.wait_until(
            f"envoy cluster {cluster} healthy",
            lambda: not probes.unhealthy_hosts(admin, {cluster}),
            timeout_s,
            lambda: None,
        )

    def wait_mesh_healthy(self, timeout_s: float = 120.0) -> None:
        """Until Envoy counts every host of every service cluster healthy: neither failing
        its health check nor ejected by outlier detection (which a previous scenario's
        errors can trigger for 30 s or more)."""
        from llm_stack import probes

        admin = self.stack.endpoints.admin
        probes.wait_until(
            "every envoy cluster healthy",
            lambda: not probes.unhealthy_hosts(admin, set(MESH_CLUSTERS)),
            timeout_s,
            lambda: None,
        )

    def restart(self, name: str, env: Mapping[str, str | None] | None = None) -> None:
        """Stop `name` gracefully and start it again, its environment changed by `env`
        (None removes a variable), then wait until it and Envoy's view of it are healthy."""
        process = self.process(name)
        process.stop()
        if env:
            changed = dict(process.spec.env)
            for variable, value in env.items():
                if value is None:
                    changed.pop(variable, None)
                else:
                    changed[variable] = value
            process.spec = replace(process.spec, env=changed)
        process.start()
        self.wait_serving(name)
        self.wait_envoy_healthy(name)


@pytest.fixture(scope="session")
def chaos_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChaosStack]:
    missing = [name for name in PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"service packages not installed: {', '.join(missing)}")
    from llm_stack import catalogue
    from llm_stack.config import StackConfig, free_ports
    from llm_stack.demo import create_key
    from llm_stack.stack import Stack

    config = StackConfig.from_env(REPO, {"LLM_RUN_DIR": str(tmp_path_factory.mktemp("stack"))})
    replicas = catalogue.local_replicas(config.models_config)
    config = replace(
        config.with_ports(free_ports(tuple(r.port for r in replicas))),
        redis_url=None,  # the stack's own redis-server (AOF in the run directory)
        redis_prefix=f"chaos{uuid.uuid4().hex[:10]}:",
        otlp=None,
        log_level="INFO",
    )
    running = Stack(config)
    endpoints = running.start()
    try:
        assert running.credentials is not None
        admin_key = running.credentials.admin_key
        demo_key = create_key(endpoints.edge_http, admin_key, requests_per_minute=0)
        yield ChaosStack(running, admin_key, demo_key)
    finally:
        running.stop()


@pytest.fixture(autouse=True)
def healthy_mesh(request: pytest.FixtureRequest) -> None:
    """Each scenario starts from a healthy mesh, whatever the one before left behind."""
    if "chaos_stack" in request.fixturenames:
        stack: ChaosStack = request.getfixturevalue("chaos_stack")
        stack.wait_mesh_healthy()
