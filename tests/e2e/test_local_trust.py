"""Threat 7 (docs/security.md) on the whole one-host stack, its own Redis and MESH_MTLS=1:
a chat completion works through the edge, while a local process that calls a service's port,
the mesh listener or the router's HTTP port directly (plaintext, forged identity headers) is
refused, and Redis refuses the default user; no password reaches a log."""

from __future__ import annotations

import json
import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from redis.exceptions import AuthenticationError

from llm_common.redis_conn import redacted
from llm_stack import probes
from llm_stack.cli import _mesh_tls
from llm_stack.config import StackConfig
from llm_stack.demo import create_key
from llm_stack.mesh_pki import mesh_paths
from llm_stack.stack import Endpoints, Stack

from .conftest import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.security]


@dataclass(frozen=True, slots=True)
class Trusting:
    stack: Stack
    endpoints: Endpoints
    config: StackConfig


@pytest.fixture(scope="module")
def trusting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Trusting]:
    run_dir = tmp_path_factory.mktemp("trust")
    env = {"LLM_RUN_DIR": str(run_dir), "LLM_PORTS": "free", "MESH_MTLS": "1"}
    config = StackConfig.from_env(REPO, env)  # no REDIS_URL: the stack's own Redis, with users
    stack = Stack(config)
    endpoints = stack.start()
    try:
        yield Trusting(stack, endpoints, config)
    finally:
        stack.stop()


def test_a_chat_goes_through_the_edge(trusting: Trusting) -> None:
    assert trusting.stack.credentials is not None
    key = create_key(trusting.endpoints.edge_http, trusting.stack.credentials.admin_key)
    body = {"model": "demo-llama", "messages": [{"role": "user", "content": "hi"}]}
    request = urllib.request.Request(
        f"http://{trusting.endpoints.edge_http}/v1/chat/completions",
        json.dumps(body | {"max_tokens": 4}).encode(),
        {"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as reply:
        assert reply.status == 200
        assert json.loads(reply.read())["choices"]


def test_service_ports_and_the_mesh_refuse_local_callers(trusting: Trusting) -> None:
    pki = trusting.stack.mesh_pki
    assert pki is not None
    for name, target in trusting.endpoints.grpc.items():
        assert not probes.grpc_serving(target), f"{name} answers a plaintext caller"
        assert probes.grpc_serving(target, tls=pki.probe_tls), f"{name} not serving"
    assert not probes.grpc_serving(trusting.endpoints.mesh)
    # The mesh listener takes the router's certificate only.
    assert not probes.grpc_serving(trusting.endpoints.mesh, tls=pki.probe_tls)
    port = trusting.config.ports.envoy.router_http
    forged = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nx-tenant-id: victim\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        raw.sendall(forged)
        assert not raw.recv(100).startswith(b"HTTP/1.1 200")


def test_redis_refuses_the_default_user_and_logs_hold_no_password(trusting: Trusting) -> None:
    url = redacted(trusting.endpoints.redis_url)  # the probe user's URL without credentials
    with redis.Redis.from_url(url) as anonymous, pytest.raises(AuthenticationError):
        anonymous.ping()
    secrets = Path(trusting.config.run_dir / "secrets")
    passwords = [
        line.split("=", 1)[1]
        for env_file in secrets.glob("redis-*.env")
        for line in env_file.read_text().splitlines()
        if line.startswith("REDIS_PASSWORD=")
    ]
    assert len(passwords) == 4  # auth, cache, billing, probe
    for log in (trusting.config.run_dir / "logs").iterdir():
        text = log.read_text(errors="replace")
        assert not [p for p in passwords if p in text], log.name


def test_status_probes_with_the_mesh_certificate(trusting: Trusting) -> None:
    # `make status` without MESH_MTLS in its environment: the Envoy layout says how it runs.
    plain = StackConfig.from_env(REPO, {"LLM_RUN_DIR": str(trusting.config.run_dir)})
    assert _mesh_tls(plain)
    tls = mesh_paths(plain.run_dir).probe_tls
    for name, target in trusting.endpoints.grpc.items():
        assert probes.grpc_serving(target, tls=tls), name
