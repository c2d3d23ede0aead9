"""Shared pytest fixtures (real Redis with per-test key prefixes); load with
`pytest_plugins = ["llm_testing.pytest_plugin"]` in the root conftest."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio
import redis.asyncio

from llm_common.redis_conn import open_client, redis_url_from_env
from llm_testing import (
    LogCapture,
    PrivateRedis,
    captured_logs,
    delete_prefixed,
    redis_url_for_tests,
)
from llm_testing.redis_cluster_local import LocalCluster


@dataclass(frozen=True, slots=True)
class ClusterHandle:
    """The session's cluster: its URL, and the local processes when this run started them."""

    url: str
    local: LocalCluster | None


@pytest.fixture
def json_logs() -> Iterator[LogCapture]:
    """The library's JSON log lines during the test (logging is restored afterwards)."""
    with captured_logs() as capture:
        yield capture


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> str:
    """URL of a real Redis: REDIS_URL, local DB 15, or an embedded redis-server; with
    LLM_TEST_REDIS_CLUSTER=1 (`make test-cluster`), a local 3+3 Redis Cluster started for
    the session (`redis+cluster://...`), or REDIS_CLUSTER_NODES when that is set."""
    if os.environ.get("LLM_TEST_REDIS_CLUSTER") == "1":
        handle: ClusterHandle = request.getfixturevalue("redis_cluster")
        return handle.url
    return redis_url_for_tests()


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[ClusterHandle]:
    """A Redis Cluster for the session: REDIS_CLUSTER_NODES, else a local 3 masters + 3
    replicas (torn down at the end)."""
    nodes = os.environ.get("REDIS_CLUSTER_NODES", "").strip()
    if nodes:
        yield ClusterHandle(url=redis_url_from_env(os.environ, None), local=None)
        return
    with LocalCluster() as cluster:
        yield ClusterHandle(url=cluster.url, local=cluster)


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix unique to this test (`test:<hex>:`); its keys are deleted afterwards."""
    return f"test:{uuid.uuid4().hex}:"


@pytest_asyncio.fixture
async def redis_client(redis_url: str, redis_prefix: str) -> AsyncIterator[redis.asyncio.Redis]:
    """An asyncio Redis client; every key under `redis_prefix` is removed after the test."""
    client = open_client(redis_url, timeout_s=5.0)
    try:
        yield client
    finally:
        await delete_prefixed(client, redis_prefix)
        await client.aclose()


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[Callable[..., PrivateRedis]]:
    """Factory: private_redis(aof=False) -> a started PrivateRedis, killed after the test."""
    started: list[PrivateRedis] = []

    def start(*, aof: bool = False) -> PrivateRedis:
        workdir = tmp_path / f"redis-{len(started)}"
        workdir.mkdir()
        server = PrivateRedis(workdir, aof=aof)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()
