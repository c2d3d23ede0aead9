"""serve(): health lifecycle, reflection, hooks and graceful shutdown on SIGTERM."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import signal
import time

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from llm_common import server as server_module
from llm_common.config import ServerSettings
from llm_common.server import BuiltServer, serve
from llm_testing import bytes_service, free_port, running_server

SERVICE = "test.v1.Echo"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def echo(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    return request


async def _health(channel: grpc.aio.Channel, service: str = "") -> int:
    response = await health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=service), timeout=5
    )
    status: int = response.status
    return status


async def test_not_serving_until_on_start_completes() -> None:
    port = free_port()  # known up front so on_start can probe its own server
    seen: list[int] = []
    stopped = asyncio.Event()

    async def on_start() -> None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            seen.extend([await _health(channel), await _health(channel, SERVICE)])

    async def on_stop() -> None:
        stopped.set()

    spec = bytes_service(SERVICE, unary={"Echo": echo}, on_start=on_start, on_stop=on_stop)
    settings = ServerSettings("echo", grpc_port=port, metrics_port=None, shutdown_grace_s=0.5)
    async with running_server(spec, settings=settings) as server:
        assert seen == [NOT_SERVING, NOT_SERVING]
        assert await _health(server.channel) == SERVING
        assert await _health(server.channel, SERVICE) == SERVING
        assert not stopped.is_set()
    assert stopped.is_set()


async def test_reflection_lists_services() -> None:
    async with running_server(bytes_service(SERVICE, unary={"Echo": echo})) as server:
        stub = reflection_pb2_grpc.ServerReflectionStub(server.channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        async for response in stub.ServerReflectionInfo(iter([request]), timeout=5):
            names = {s.name for s in response.list_services_response.service}
    assert names == {SERVICE, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"}


async def test_sigterm_drains_with_health_not_serving() -> None:
    ready: asyncio.Future[BuiltServer] = asyncio.get_running_loop().create_future()
    stopped = asyncio.Event()

    async def on_stop() -> None:
        stopped.set()

    spec = bytes_service(SERVICE, unary={"Echo": echo}, on_stop=on_stop)
    settings = ServerSettings("echo", grpc_port=0, metrics_port=0, shutdown_grace_s=2.0)
    task = asyncio.create_task(serve(settings, spec, ready=ready.set_result))
    built = await asyncio.wait_for(ready, 10)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{built.port}") as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        assert (await watch.read()).status == SERVING
        os.kill(os.getpid(), signal.SIGTERM)  # serve() installed its handler before `ready`
        assert (await asyncio.wait_for(watch.read(), 5)).status == NOT_SERVING
        watch.cancel()  # let the drain finish before the grace period
    await asyncio.wait_for(task, 10)
    assert stopped.is_set()


def _listening_addresses(port: int) -> set[str]:
    """The local addresses of the TCP sockets listening on `port` (Linux /proc/net)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as rows:
            for row in list(rows)[1:]:
                local, state = row.split()[1], row.split()[3]
                address, hex_port = local.split(":")
                if state != "0A" or int(hex_port, 16) != port:  # 0A: LISTEN
                    continue
                raw = bytes.fromhex(address)
                # The kernel prints each 32-bit word in host (little-endian) order.
                raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                ip = ipaddress.ip_address(raw)
                mapped = getattr(ip, "ipv4_mapped", None)  # grpc binds IPv4 on IPv6 sockets
                found.add(str(mapped or ip))
    return found


@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="reads Linux /proc/net")
@pytest.mark.parametrize(
    ("bind_host", "listening"), [("127.0.0.1", {"127.0.0.1"}), ("[::]", {"::"})]
)
async def test_bind_host_is_where_the_server_listens(bind_host: str, listening: set[str]) -> None:
    ready: asyncio.Future[BuiltServer] = asyncio.get_running_loop().create_future()
    stop = asyncio.Event()
    settings = ServerSettings("echo", grpc_port=0, metrics_port=None, bind_host=bind_host)
    task = asyncio.create_task(
        serve(settings, bytes_service(SERVICE, unary={"Echo": echo}), stop=stop,
              ready=ready.set_result)
    )  # fmt: skip
    try:
        built = await asyncio.wait_for(ready, 10)
        assert _listening_addresses(built.port) == listening
        async with grpc.aio.insecure_channel(f"127.0.0.1:{built.port}") as channel:
            assert await _health(channel) == SERVING
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_failed_on_start_stops_the_server_without_on_stop() -> None:
    stopped = asyncio.Event()

    async def on_start() -> None:
        raise ConnectionError("redis down")

    async def on_stop() -> None:
        stopped.set()

    spec = bytes_service(SERVICE, unary={"Echo": echo}, on_start=on_start, on_stop=on_stop)
    with pytest.raises(ConnectionError):
        async with running_server(spec):
            pass
    assert not stopped.is_set()


class _StubbornServer:
    """A server whose stop() swallows its cancellation (as a wedged grpc stop can): the one
    case the real server cannot be made to produce on demand."""

    def __init__(self) -> None:
        self.cancelled = 0

    async def stop(self, grace: float | None) -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            self.cancelled += 1  # swallowed once; the test's own teardown cancels it for good
        await asyncio.sleep(3600)


async def test_stop_gives_up_even_when_the_server_swallows_cancellation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(server_module, "STOP_MARGIN_S", 0.2)
    stubborn = _StubbornServer()
    built = server_module.BuiltServer(
        server=stubborn,  # type: ignore[arg-type]
        health=health.aio.HealthServicer(),
        port=0,
    )
    started = time.monotonic()
    await server_module._stop(built, grace_s=0.1)
    assert time.monotonic() - started < 2.0
    await asyncio.sleep(0)  # let the cancellation reach the stubborn stop()
    assert stubborn.cancelled == 1
