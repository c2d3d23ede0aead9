"""The rendered local edge on a real Envoy, for tests and benches that attack it: the router is
replaced by recording upstreams (gRPC and the OpenAI HTTP port) that count what reached them;
auth is the caller's (a real auth server's gRPC and HTTP ext_authz ports, or none)."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import select
import socket
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from llm_envoy import mesh_view
from llm_envoy.certs import ensure_dev_pki
from llm_envoy.layouts import LocalPorts
from llm_envoy.local_spec import LocalSpec
from llm_envoy.policy import load_policy
from llm_envoy.policy_model import MeshPolicy
from llm_envoy.render import render_local_spec
from llm_envoy.topology import LLM_SERVICE, SERVICES, Endpoint
from llm_envoy.validate import envoy_binary

START_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(slots=True)
class Recorder:
    """What reached the stand-in router: gRPC calls by method, HTTP requests by path."""

    grpc_calls: list[str] = field(default_factory=list)
    http_requests: list[str] = field(default_factory=list)


class _RecordingHandler(grpc.GenericRpcHandler):
    def __init__(self, recorder: Recorder) -> None:
        self._recorder = recorder

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> Any:
        method: str = handler_call_details.method
        if method.startswith("/grpc.health"):
            return None

        async def answer(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
            self._recorder.grpc_calls.append(method)
            return b""

        return grpc.unary_unary_rpc_method_handler(answer)


@contextlib.asynccontextmanager
async def recording_router(recorder: Recorder) -> AsyncIterator[int]:
    """A gRPC server that answers every method with an empty message and is SERVING."""
    server = grpc.aio.server()
    checker = health.aio.HealthServicer()
    for name in ("", LLM_SERVICE):
        await checker.set(name, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(checker, server)
    server.add_generic_rpc_handlers((_RecordingHandler(recorder),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(None)


@contextlib.asynccontextmanager
async def recording_http(recorder: Recorder) -> AsyncIterator[int]:
    """An HTTP/1.1 server (the router's OpenAI port) that records each request's path."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                recorder.http_requests.append(lines[0].split(" ")[1])
                length = 0
                for line in lines[1:]:
                    name, _, value = line.partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value)
                await reader.readexactly(length)
                body = b'{"object":"list","data":[]}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    + f"content-length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port: int = server.sockets[0].getsockname()[1]
    try:
        yield port
    finally:
        server.close()
        await server.wait_closed()


@dataclass(frozen=True, slots=True)
class AuthPorts:
    """A running auth: its main gRPC port (rate limits) and its HTTP ext_authz port."""

    grpc: int
    http: int


@dataclass(frozen=True, slots=True)
class RunningEdge:
    """Envoy with the local flavour's edge; `log` holds its stdout (access logs) and stderr."""

    workdir: Path
    edge_http: str
    mesh: str  # the mesh's outbound listener (the router's side)
    admin: str  # the admin's read-only loopback listener
    log: Path
    recorder: Recorder
    process: subprocess.Popen[bytes]

    def log_text(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


def _ports(router: int, router_http: int, auth: AuthPorts | None) -> LocalPorts:
    grpc_ports = {name: free_port() for name in SERVICES}
    grpc_ports["router"] = router
    if auth is not None:
        grpc_ports["auth"] = auth.grpc
    return replace(
        LocalPorts(),
        edge_http=free_port(),
        edge_tls=free_port(),
        admin=free_port(),
        mesh=free_port(),
        router_http=router_http,
        grpc=grpc_ports,
        inference=(free_port(),),
        auth_http=None if auth is None else auth.http,
    )


@contextlib.asynccontextmanager
async def running_edge(
    workdir: Path,
    protos_root: Path,
    *,
    auth: AuthPorts | None,
    policy: MeshPolicy | None = None,
    healthy: tuple[str, ...] = ("router",),
    patch: Callable[[Path], None] | None = None,
    otlp: Endpoint | None = None,
) -> AsyncIterator[RunningEdge]:
    """The rendered local config on a real Envoy in front of recording upstreams; waits until
    the clusters in `healthy` are. `patch` may edit the rendered files first (a bench's
    baseline: the config as it was before a fix)."""
    recorder = Recorder()
    async with recording_router(recorder) as router, recording_http(recorder) as http:
        spec = LocalSpec(_ports(router, http, auth), otlp=otlp)
        ensure_dev_pki(workdir / "certs", mesh_identity="spiffe://llm.local/ns/llm/sa/test")
        boot = render_local_spec(spec, workdir, protos_root, policy or load_policy())
        if patch is not None:
            patch(workdir)
        log = workdir / "envoy.log"
        process = _start_envoy(boot, workdir, log)
        edge = RunningEdge(
            workdir,
            f"127.0.0.1:{spec.ports.edge_http}",
            f"127.0.0.1:{spec.ports.mesh}",
            spec.admin,
            log,
            recorder,
            process,
        )
        try:
            await asyncio.to_thread(_wait_healthy, edge, healthy)
            yield edge
        finally:
            process.terminate()
            await asyncio.to_thread(process.wait, 10)


def _start_envoy(boot: Path, workdir: Path, log: Path) -> subprocess.Popen[bytes]:
    args = [str(envoy_binary()), "-c", str(boot), "--disable-hot-restart"]
    args += ["--log-level", "warn", "--file-flush-interval-msec", "100"]
    with log.open("wb") as sink:
        return subprocess.Popen(args, cwd=workdir, stdout=sink, stderr=subprocess.STDOUT)


def _wait_healthy(edge: RunningEdge, clusters: tuple[str, ...]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if edge.process.poll() is not None:
            raise RuntimeError(f"envoy exited:\n{edge.log_text()[-3000:]}")
        with contextlib.suppress(OSError):
            status = mesh_view.cluster_status(edge.admin)
            if all(status.get(c, {}).get("healthy") == 1 for c in clusters):
                return
        time.sleep(0.2)
    raise TimeoutError(f"clusters {clusters} not healthy:\n{edge.log_text()[-3000:]}")


def wait_for(condition: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Poll `condition` (e.g. an access-log line, written about once a second)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def admin_get(admin: str, path: str) -> bytes:
    with urllib.request.urlopen(f"http://{admin}{path}", timeout=5) as reply:
        body: bytes = reply.read()
        return body


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    status: int
    headers: dict[str, str]
    body: bytes


def post_body(
    address: str, path: str, headers: dict[str, str], size: int, *, chunked: bool = False
) -> HttpAnswer:
    """POST `size` bytes over HTTP/1.1 the way curl does: stop sending as soon as the server
    answers (an early 413), then read the answer."""
    host, _, port = address.rpartition(":")
    lines = [f"POST {path} HTTP/1.1", f"host: {address}", "connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines.append("transfer-encoding: chunked" if chunked else f"content-length: {size}")
    piece = 64 * 1024
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        with contextlib.suppress(OSError):
            _send_until_answered(conn, size, piece, chunked)
        return _read_answer(conn)


def _send_until_answered(conn: socket.socket, size: int, piece: int, chunked: bool) -> None:
    sent = 0
    while sent < size:
        if select.select([conn], [], [], 0)[0]:
            return  # the server answered before taking the whole body
        n = min(piece, size - sent)
        data = b"a" * n
        conn.sendall(f"{n:x}\r\n".encode() + data + b"\r\n" if chunked else data)
        sent += n
    if chunked:
        conn.sendall(b"0\r\n\r\n")


def _read_answer(conn: socket.socket) -> HttpAnswer:
    raw = b""
    with contextlib.suppress(OSError):
        while chunk := conn.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1]) if lines[0] else 0
    found = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        found[name.strip().lower()] = value.strip()
    return HttpAnswer(status, found, body)


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("admin", timeout=5)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(5)
        sock.connect(str(self._path))
        self.sock = sock


def socket_request(path: Path, method: str, target: str) -> tuple[int, bytes]:
    """An HTTP request to the admin's unix socket (what an operator's curl --unix-socket does)."""
    conn = _UnixConnection(path)
    try:
        conn.request(method, target)
        reply = conn.getresponse()
        return reply.status, reply.read()
    finally:
        conn.close()


def http_status(address: str, method: str, target: str, host: str | None = None) -> int:
    """The status of one plain request over TCP (404s included)."""
    conn = http.client.HTTPConnection(address, timeout=5)
    try:
        conn.request(method, target, headers={"host": host or address})
        reply = conn.getresponse()
        reply.read()
        return reply.status
    finally:
        conn.close()
