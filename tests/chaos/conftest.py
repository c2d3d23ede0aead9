"""A whole platform per chaos session, started by the `make up` supervisor's Stack on free ports
with a Redis of its own (so it can be restarted), kept as a Stack object so the scenarios can
kill, stop and restart its processes."""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Iterator
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
