"""The container health probe against a real server: SERVING → 0, down or draining → 1."""

from __future__ import annotations

import asyncio

from grpc_health.v1 import health_pb2

from llm_common.healthcheck import main
from llm_testing import bytes_service, free_port, running_server


async def test_probe_follows_the_servers_health() -> None:
    async with running_server(bytes_service("test.v1.Probe")) as server:
        env = {"GRPC_PORT": str(server.port)}
        assert await asyncio.to_thread(main, env) == 0
        await server.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert await asyncio.to_thread(main, env) == 1


async def test_probe_fails_when_nothing_listens() -> None:
    assert await asyncio.to_thread(main, {"GRPC_PORT": str(free_port())}) == 1


def test_probe_needs_a_port() -> None:
    assert main({}) == 2
