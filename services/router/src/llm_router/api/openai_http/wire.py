"""HTTP/1.1 on asyncio streams: read one request (bounded), write plain or chunked responses."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MAX_HEADER_BYTES = 32 * 1024
MAX_HEADERS = 100
MAX_BODY_BYTES = 4 * 1024 * 1024
DRAIN_FACTOR = 8  # an oversized body is read and dropped up to 8 x the limit (see _discard)
DRAIN_CHUNK_BYTES = 64 * 1024
_REASONS = {
    100: "Continue",
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    499: "Client Closed Request",
    500: "Internal Server Error",
    501: "Not Implemented",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
}


class HttpError(Exception):
    """A request that cannot be read; answered with `status` and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One parsed request. Header names are lower-case; repeated headers keep the first."""

    method: str
    path: str  # without the query string
    query: str
    version: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return connection == "keep-alive"
        return connection != "close"


async def read_request(
    reader: asyncio.StreamReader,
    send_continue: Callable[[], None],
    max_body: int = MAX_BODY_BYTES,
) -> HttpRequest | None:
    """The next request on the connection, None at a clean end of stream. `send_continue`
    answers `Expect: 100-continue` before the body is read."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise HttpError(400, "incomplete request head") from None
    except asyncio.LimitOverrunError:
        raise HttpError(431, "request head too large") from None
    method, target, version, headers = _parse_head(head)
    path, _, query = target.partition("?")
    if headers.get("expect", "").lower() == "100-continue":
        send_continue()
    body = await _read_body(reader, headers, max_body)
    return HttpRequest(method, path, query, version, headers, body)


def _parse_head(head: bytes) -> tuple[str, str, str, dict[str, str]]:
    if len(head) > MAX_HEADER_BYTES:
        raise HttpError(431, "request head too large")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[1].startswith("/"):
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HttpError(505, "only HTTP/1.1 is served")
    headers: dict[str, str] = {}
    fields = [line for line in lines[1:] if line]
    if len(fields) > MAX_HEADERS:
        raise HttpError(431, "too many headers")
    for line in fields:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise HttpError(400, "malformed header line")
        key = name.lower()
        if key == "content-length" and key in headers and headers[key] != value.strip():
            raise HttpError(400, "conflicting content-length headers")
        headers.setdefault(key, value.strip())
    return method, target, version, headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str], max_body: int) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return await _read_chunked(reader, max_body)
    raw = headers.get("content-length")
    if raw is None:
        return b""
    if not raw.isdigit():
        raise HttpError(400, "invalid content-length")
    length = int(raw)
    if length > max_body:
        await _discard(reader, length, max_body)
        raise HttpError(413, f"request body exceeds {max_body} bytes")
    try:
        return await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        raise HttpError(400, "request body shorter than content-length") from None


async def _discard(reader: asyncio.StreamReader, length: int, max_body: int) -> None:
    # Read an oversized body before answering 413: a proxy still sending it would take the
    # early close for a failed upstream (Envoy answers 503). Only up to DRAIN_FACTOR x the
    # limit, so a huge declared length cannot keep the connection busy.
    if length > DRAIN_FACTOR * max_body:
        return
    remaining = length
    with contextlib.suppress(asyncio.IncompleteReadError):
        while remaining:
            chunk = await reader.readexactly(min(remaining, DRAIN_CHUNK_BYTES))
            remaining -= len(chunk)


async def _read_chunked(reader: asyncio.StreamReader, max_body: int) -> bytes:
    body = bytearray()
    try:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size_text = size_line.split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise HttpError(400, "malformed chunk size") from None
            if size == 0:
                await _skip_trailers(reader)
                return bytes(body)
            if len(body) + size > max_body:
                raise HttpError(413, f"request body exceeds {max_body} bytes")
            body += await reader.readexactly(size)
            if await reader.readexactly(2) != b"\r\n":
                raise HttpError(400, "malformed chunk")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        raise HttpError(400, "truncated chunked body") from None


async def _skip_trailers(reader: asyncio.StreamReader) -> None:
    while (await reader.readuntil(b"\r\n")) != b"\r\n":
        pass


CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"


def _head(status: int, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class ResponseWriter:
    """Writes one response: whole (`send`) or as a chunked stream (`start`, `chunk`, `end`)."""

    def __init__(self, writer: asyncio.StreamWriter, keep_alive: bool) -> None:
        self._writer = writer
        self._keep_alive = keep_alive
        self.started = False

    def _connection(self) -> dict[str, str]:
        return {"connection": "keep-alive" if self._keep_alive else "close"}

    async def send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        base = {"content-length": str(len(body)), **self._connection(), **headers}
        self._writer.write(_head(status, base) + body)
        self.started = True
        await self._writer.drain()

    async def send_json(
        self, status: int, payload: Any, headers: dict[str, str] | None = None
    ) -> None:
        body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        await self.send(status, body, {"content-type": "application/json", **(headers or {})})

    async def start(self, status: int, headers: dict[str, str]) -> None:
        base = {"transfer-encoding": "chunked", **self._connection(), **headers}
        self._writer.write(_head(status, base))
        self.started = True
        await self._writer.drain()

    async def chunk(self, data: bytes) -> None:
        """One chunk, flushed at once (an SSE event must not wait in a buffer)."""
        if data:
            self._writer.write(b"%x\r\n%s\r\n" % (len(data), data))
            await self._writer.drain()

    async def end(self) -> None:
        self._writer.write(b"0\r\n\r\n")
        await self._writer.drain()
