"""The listener over raw sockets: framing, SSE ending in [DONE], HTTP errors, keep-alive, close."""

from __future__ import annotations

import asyncio
import json

import pytest

from .conftest import Listener, raw_exchange

pytestmark = pytest.mark.integration

CHAT = json.dumps({"model": "demo", "messages": [{"role": "user", "content": "a b"}]}).encode()


def post(path: str, body: bytes, *extra: str) -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def split(response: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = response.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    pairs = (line.split(": ", 1) for line in lines[1:])
    headers = {name.lower(): value for name, value in pairs}
    return int(lines[0].split()[1]), headers, body


def dechunk(body: bytes) -> bytes:
    out = b""
    while body:
        size_text, _, rest = body.partition(b"\r\n")
        size = int(size_text, 16)
        if size == 0:
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return out


async def test_sse_events_end_with_done(listener: Listener) -> None:
    body = json.dumps(
        {"model": "demo", "messages": [{"role": "user", "content": "a b"}], "stream": True}
    ).encode()
    status, headers, raw = split(
        await raw_exchange(
            listener.http.port, post("/v1/chat/completions", body, "Connection: close")
        )
    )
    assert status == 200
    assert headers["content-type"] == "text/event-stream"
    assert headers["transfer-encoding"] == "chunked"
    events = dechunk(raw).split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""]
    payloads = [json.loads(e.removeprefix(b"data: ")) for e in events[:-2]]
    assert all(p["object"] == "chat.completion.chunk" for p in payloads)


@pytest.mark.parametrize(
    ("request_bytes", "status", "error_type"),
    [
        (post("/v1/chat/completions", b"{oops"), 400, "invalid_request_error"),
        (post("/v1/nowhere", b"{}"), 404, "invalid_request_error"),
        (b"GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n", 405, "invalid_request_error"),
        (
            b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n",
            413,
            "invalid_request_error",
        ),
        (b"BROKEN\r\n\r\n", 400, "invalid_request_error"),
    ],
)
async def test_http_errors_are_openai_shaped(
    listener: Listener, request_bytes: bytes, status: int, error_type: str
) -> None:
    answer = await raw_exchange(
        listener.http.port, request_bytes.replace(b"Host: x", b"Host: x\r\nConnection: close", 1)
    )
    got, headers, body = split(answer)
    assert got == status
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert error["type"] == error_type
    assert set(error) == {"message", "type", "param", "code"}
    if status == 405:
        assert headers["allow"] == "POST"


async def test_keep_alive_serves_several_requests_on_one_connection(listener: Listener) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.http.port)
    try:
        for _ in range(3):
            writer.write(post("/v1/chat/completions", CHAT))
            head = await reader.readuntil(b"\r\n\r\n")
            status, headers, _ = split(head)
            body = await reader.readexactly(int(headers["content-length"]))
            assert status == 200
            assert json.loads(body)["choices"][0]["message"]["content"] == "b a"
    finally:
        writer.close()


async def test_chunked_request_bodies(listener: Listener) -> None:
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(CHAT), CHAT)
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    status, _, body = split(await raw_exchange(listener.http.port, head + chunked))
    assert status == 200
    assert json.loads(body)["choices"][0]["message"]["content"] == "b a"


async def test_close_finishes_the_request_in_flight_then_refuses(listener: Listener) -> None:
    body = json.dumps(
        {"model": "endless", "messages": [{"role": "user", "content": "x"}], "stream": True}
    ).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", listener.http.port)
    writer.write(post("/v1/chat/completions", body))
    await reader.readuntil(b"data:")  # the stream is running
    await listener.http.close(grace_s=0.2)  # it never ends by itself: cancelled after grace
    await asyncio.wait_for(listener.llm.seen.cancelled.wait(), timeout=5)
    writer.close()
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", listener.http.port)
