"""The rendered edge on a real Envoy with a real auth (HTTP ext_authz, Redis) and one key."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from llm_auth.testing import delete_prefix, make_settings, serving, unique_prefix
from llm_envoy.policy_model import MeshPolicy
from llm_envoy.testing import AuthPorts, RunningEdge, running_edge

from .conftest import PROTOS


@dataclass(frozen=True)
class Edge:
    envoy: RunningEdge
    key: str  # a valid API key (completion:write)


@contextlib.asynccontextmanager
async def edge_with_auth(
    redis_url: str, workdir: Path, policy: MeshPolicy | None = None
) -> AsyncIterator[Edge]:
    prefix = unique_prefix()
    settings = make_settings(redis_url, prefix, http_authz_port=0)
    try:
        async with serving(settings) as auth:
            assert auth.app.http_authz is not None
            _, key = await auth.create_key(f"t-{uuid.uuid4().hex[:8]}")
            ports = AuthPorts(grpc=auth.port, http=auth.app.http_authz.port)
            healthy = ("router", "auth_http")
            async with running_edge(
                workdir, PROTOS, auth=ports, policy=policy, healthy=healthy
            ) as envoy:
                yield Edge(envoy, key.text)
    finally:
        await delete_prefix(redis_url, prefix)
