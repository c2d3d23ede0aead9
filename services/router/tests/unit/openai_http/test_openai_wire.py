"""HTTP/1.1 request reading: framing, limits and malformed input (a StreamReader, no socket)."""

from __future__ import annotations

import asyncio

import pytest

from llm_router.api.openai_http.wire import HttpError, HttpRequest, read_request


async def read(data: bytes, max_body: int = 1024) -> tuple[HttpRequest | None, list[str]]:
    reader = asyncio.StreamReader(limit=8 * 1024)
    reader.feed_data(data)
    reader.feed_eof()
    continued: list[str] = []
    request = await read_request(reader, lambda: continued.append("100"), max_body)
    return request, continued


async def test_a_request_with_a_body_and_query() -> None:
    request, _ = await read(
        b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n"
        b"X-Tenant-Id: t1\r\n\r\n{}"
    )
    assert request is not None
    assert (request.method, request.path, request.query, request.body) == (
        "POST",
        "/v1/chat/completions",
        "x=1",
        b"{}",
    )
    assert request.headers["x-tenant-id"] == "t1"
    assert request.keep_alive


async def test_chunked_bodies_are_reassembled() -> None:
    request, _ = await read(
        b"POST /v1/embeddings HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nTrailer: x\r\n\r\n"
    )
    assert request is not None
    assert request.body == b"abcde"


async def test_expect_continue_is_answered_before_the_body() -> None:
    request, continued = await read(
        b"POST /v1/x HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nz"
    )
    assert continued == ["100"]
    assert request is not None
    assert request.body == b"z"


async def test_clean_end_of_stream_is_no_request() -> None:
    request, _ = await read(b"")
    assert request is None


async def test_connection_close_and_http_1_0() -> None:
    closing, _ = await read(b"GET /v1/models HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert closing is not None
    assert not closing.keep_alive
    old, _ = await read(b"GET /v1/models HTTP/1.0\r\n\r\n")
    assert old is not None
    assert not old.keep_alive


@pytest.mark.parametrize(
    ("data", "status"),
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET /v1/models HTTP/2.0\r\n\r\n", 505),
        (b"GET v1 HTTP/1.1\r\n\r\n", 400),
        (b"GET /v1/models HTTP/1.1\r\nno colon\r\n\r\n", 400),
        (b"POST /v1/x HTTP/1.1\r\nContent-Length: 5000\r\n\r\n", 413),
        (b"POST /v1/x HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
        (b"POST /v1/x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400),
        (b"POST /v1/x HTTP/1.1\r\nContent-Length: 10\r\n\r\nshort", 400),
        (b"POST /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
        (b"POST /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n", 413),
        (b"GET /v1/models HTTP/1.1\r\nHost: a", 400),
        (b"GET /v1/models HTTP/1.1\r\n" + b"X-Big: " + b"a" * 9000 + b"\r\n\r\n", 431),
    ],
)
async def test_malformed_or_oversized_requests(data: bytes, status: int) -> None:
    with pytest.raises(HttpError) as err:
        await read(data)
    assert err.value.status == status


async def test_an_oversized_body_is_read_before_the_413() -> None:
    # A proxy still sending the body would take an early close for a failed upstream.
    reader = asyncio.StreamReader()
    reader.feed_data(b"POST /v1/x HTTP/1.1\r\nContent-Length: 3000\r\n\r\n" + b"x" * 3000)
    reader.feed_data(b"GET /v1/models HTTP/1.1\r\n\r\n")
    reader.feed_eof()
    with pytest.raises(HttpError) as err:
        await read_request(reader, lambda: None, 1024)
    assert err.value.status == 413
    following = await read_request(reader, lambda: None, 1024)
    assert following is not None
    assert following.path == "/v1/models"


async def test_a_huge_declared_body_is_not_waited_for() -> None:
    reader = asyncio.StreamReader()
    reader.feed_data(b"POST /v1/x HTTP/1.1\r\nContent-Length: 1000000000\r\n\r\nxyz")
    with pytest.raises(HttpError) as err:  # no EOF fed: waiting for the body would hang
        await asyncio.wait_for(read_request(reader, lambda: None, 1024), 5.0)
    assert err.value.status == 413
