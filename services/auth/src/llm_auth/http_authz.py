"""Envoy's ext_authz over HTTP (`http_service`): the same decision as the gRPC Check, answered
by a minimal HTTP/1.1 server.

Why a second transport: Envoy asks on every edge request, so the latency of this call is what
auth adds to the product. A grpc-python call hops from grpc's poller thread to the event loop
and runs HTTP/2 framing in Python-facing code; a plain HTTP/1.1 exchange on an asyncio stream
is one read and one write on the loop. The decision itself is shared with Check
(`AuthorizationServicer.decide`), so both transports accept and deny exactly alike.

Protocol, as Envoy's HTTP ext_authz client speaks it: the check request carries the original
method, `path_prefix` + the original path, the headers `allowed_headers` lets through and
`content-length: 0`. `200` allows: the identity headers of the reply are copied upstream
(Envoy's `allowed_upstream_headers`) and `x-envoy-auth-headers-to-remove` drops the
credential. Any other status denies with that status, body and the headers Envoy's
`allowed_client_headers` lets through. Routes that demand scopes say so in their path prefix
(`/authz;scopes=a,b`), which a client cannot alter: the original path only follows it.
`GET /healthz` answers 200 for Envoy's active health check, whatever the public paths are.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from opentelemetry import trace

from llm_auth.extauthz import (
    CREDENTIAL_HEADERS,
    IDENTITY_HEADERS,
    AllowedReplies,
    AuthorizationServicer,
    Denial,
    RequestRates,
    client_address,
    identity_headers,
)
from llm_auth.principal import Principal
from llm_common.logging import get_logger
from llm_common.metrics import RpcMetrics, default_rpc_metrics
from llm_common.tracing import ServerSpan, rpc_tracer

PATH_PREFIX = "/authz"
HEALTH_PATH = "/healthz"  # the listener's own liveness, for Envoy's active health check
SCOPES_MARK = ";scopes="
MAX_HEAD_BYTES = 16 * 1024  # Envoy's default max request headers size is 60 KiB; ours are few
MAX_BODY_BYTES = 64 * 1024  # only with Envoy's with_request_body, which we do not use
REMOVE_HEADER = "x-envoy-auth-headers-to-remove"
METRICS_SERVICE = "ext_authz_http"  # the `service` label of this listener's llm_rpc_* metrics
SPAN_NAME = f"/{METRICS_SERVICE}/Check"
_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden"}
_REASONS |= {413: "Payload Too Large", 431: "Request Header Fields Too Large"}
_REASONS |= {429: "Too Many Requests", 503: "Service Unavailable"}
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_log = get_logger(__name__)


class BadRequest(Exception):  # noqa: N818 - names the HTTP answer it becomes
    """The check request itself is malformed (never a client of the API: Envoy sent it)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class CheckRequest:
    """What a check request says: the original path, the route's scopes, its headers."""

    path: str
    scopes: tuple[str, ...]
    headers: dict[str, str]
    body_bytes: int
    health: bool = False  # the listener's own health check, not an authorization


def parse_head(head: bytes) -> CheckRequest:
    """The request line and headers (the bytes before the blank line)."""
    try:
        text = head.decode("latin-1")
    except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
        raise BadRequest(400, "undecodable request head") from None
    line, _, rest = text.partition("\r\n")
    parts = line.split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/1.") or not _TOKEN.fullmatch(parts[0]):
        raise BadRequest(400, "malformed request line")
    headers: dict[str, str] = {}
    for field in rest.split("\r\n") if rest else ():
        name, sep, value = field.partition(":")
        if not sep or not _TOKEN.fullmatch(name):
            raise BadRequest(400, "malformed header line")
        name = name.lower()
        value = value.strip(" \t")
        # Repeated headers join as HTTP allows (Envoy forwards each once; a repeat is odd).
        headers[name] = f"{headers[name]},{value}" if name in headers else value
    body_bytes = _body_bytes(headers)
    if parts[1] == HEALTH_PATH:
        return CheckRequest(HEALTH_PATH, (), headers, body_bytes, health=True)
    path, scopes = split_path(parts[1])
    return CheckRequest(path, scopes, headers, body_bytes)


def split_path(target: str) -> tuple[str, tuple[str, ...]]:
    """`/authz[;scopes=a,b]/original/path` -> the original path and the route's scopes."""
    if not target.startswith(PATH_PREFIX):
        raise BadRequest(400, f"check path must start with {PATH_PREFIX}")
    rest = target[len(PATH_PREFIX) :]
    scopes: tuple[str, ...] = ()
    if rest.startswith(SCOPES_MARK):
        listed, slash, rest = rest[len(SCOPES_MARK) :].partition("/")
        scopes = tuple(s for s in listed.split(",") if s)
        rest = slash + rest
    if not rest.startswith("/"):
        raise BadRequest(400, "check path lacks the original path")
    return rest, scopes


def _body_bytes(headers: dict[str, str]) -> int:
    if "transfer-encoding" in headers:
        raise BadRequest(400, "chunked check requests are not supported")
    raw = headers.get("content-length", "0")
    if not raw.isdigit():
        raise BadRequest(400, "malformed content-length")
    size = int(raw)
    if size > MAX_BODY_BYTES:
        raise BadRequest(413, "check request body too large")
    return size


def response(status: int, headers: Sequence[tuple[str, str]], body: bytes = b"") -> bytes:
    """An HTTP/1.1 response; header values were validated by their sources, CR/LF refused."""
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}"]
    for name, value in (*headers, ("content-length", str(len(body)))):
        if "\r" in value or "\n" in value:
            raise ValueError(f"header {name} holds a line break")
        lines.append(f"{name}: {value}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def allowed_reply(principal: Principal, rates: RequestRates) -> bytes:
    """200: identity headers for the upstream, credentials and unset identity headers
    removed from the upstream request."""
    headers = identity_headers(principal, rates)
    names = {name for name, _ in headers}
    remove = [*CREDENTIAL_HEADERS, *(h for h in IDENTITY_HEADERS if h not in names)]
    return response(200, [*headers, (REMOVE_HEADER, ",".join(remove))])


PUBLIC_REPLY = response(200, [(REMOVE_HEADER, ",".join(IDENTITY_HEADERS))])
HEALTHY_REPLY = response(200, [("content-type", "text/plain")], b"ok\n")


def denied_reply(denial: Denial) -> bytes:
    return response(denial.http_status, denial.headers, denial.body.encode())


class HttpAuthorizer:
    """Answers check requests with the decision of `authz`. Each check is counted and timed
    in the `llm_rpc_*` metrics as service `ext_authz_http`, method `Check`: code OK when it
    was answered, a denial included (as the gRPC Check's denials are OK replies; answers by
    HTTP status are in llm_auth_ext_authz_checks), INTERNAL when it failed."""

    def __init__(
        self,
        authz: AuthorizationServicer,
        metrics: RpcMetrics | None = None,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self._authz = authz
        self._metrics = metrics or default_rpc_metrics()
        self._tracer = tracer or rpc_tracer()
        self._allowed = AllowedReplies(allowed_reply, authz.rates)
        self._idle: set[asyncio.StreamWriter] = set()  # between requests
        self._closing = False

    def close_connections(self) -> None:
        """At shutdown: idle connections close now, busy ones after their answer."""
        self._closing = True
        for writer in list(self._idle):
            writer.close()

    async def answer(self, request: CheckRequest) -> bytes:
        if request.health:
            return HEALTHY_REPLY
        self._metrics.started(METRICS_SERVICE, "Check")
        start, code = time.perf_counter(), "OK"
        # Envoy's ext_authz client sends the request's trace context: the check joins the
        # trace (recorded when the caller sampled it); without one, no span is made at all.
        span = (
            ServerSpan.start(self._tracer, SPAN_NAME, request.headers.items())
            if "traceparent" in request.headers
            else None
        )
        try:
            client = client_address(request.headers)
            decision = await self._authz.decide(
                request.path, request.headers, request.scopes, "", client=client
            )
            if decision is None:
                return PUBLIC_REPLY
            if isinstance(decision, Denial):
                return denied_reply(decision)
            return self._allowed.get(decision)
        except BaseException:
            code = "INTERNAL"
            raise
        finally:
            self._metrics.finished(METRICS_SERVICE, "Check", code, time.perf_counter() - start)
            if span is not None:
                span.end(grpc.StatusCode[code])

    async def serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """Keep-alive: requests are answered in order until the peer closes."""
        try:
            while not self._closing:
                self._idle.add(writer)
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return  # closed between requests
                except asyncio.LimitOverrunError:
                    writer.write(response(431, [("connection", "close")]))
                    return
                finally:
                    self._idle.discard(writer)
                if not await self._exchange(head[:-4], reader, writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return  # the peer went away mid-request; nothing to answer
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    async def _exchange(
        self, head: bytes, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """One request; False when the connection must close."""
        try:
            request = parse_head(head)
        except BadRequest as err:
            _log.warning("malformed ext_authz HTTP request", status=err.status, error=str(err))
            writer.write(response(err.status, [("connection", "close")]))
            return False
        if request.body_bytes:
            await reader.readexactly(request.body_bytes)  # unused: decisions need no body
        writer.write(await self.answer(request))
        await writer.drain()
        return True


@dataclass(frozen=True, slots=True)
class HttpAuthzServer:
    """The running HTTP ext_authz listener."""

    server: asyncio.Server
    authorizer: HttpAuthorizer
    port: int

    async def stop(self, grace_s: float) -> None:
        """Stop accepting, answer the requests in progress (up to `grace_s`), close."""
        self.server.close()
        self.authorizer.close_connections()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.server.wait_closed(), grace_s)


async def start_http_authz(
    port: int,
    authz: AuthorizationServicer,
    *,
    host: str | None = None,
    metrics: RpcMetrics | None = None,
) -> HttpAuthzServer:
    """Serve HTTP ext_authz on `port` (0 picks a free one): on `host`, or on every interface
    (IPv4 and IPv6 on one socket where the host has both)."""
    authorizer = HttpAuthorizer(authz, metrics)
    server = await asyncio.start_server(
        authorizer.serve_connection, sock=listening_socket(host, port), limit=MAX_HEAD_BYTES
    )
    bound = server.sockets[0].getsockname()[1]
    _log.info("serving Envoy's HTTP ext_authz", port=bound)
    return HttpAuthzServer(server, authorizer, bound)


def listening_socket(host: str | None, port: int) -> socket.socket:
    if host is not None:
        return socket.create_server((host, port))
    if socket.has_dualstack_ipv6():
        return socket.create_server(("::", port), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("0.0.0.0", port))  # every interface, by design
