"""RedisMux, the auto-pipelined hot-path connection, on real Redis: replies reach their own
callers under concurrency, error replies stay per command, AUTH and SELECT are applied, and a
lost or hung connection fails the calls in flight and is replaced by the next call."""

from __future__ import annotations

import asyncio
import hashlib
import signal
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from llm_common.redis_mux import (
    Endpoint,
    PoolPipeline,
    RedisMux,
    ReplicaWait,
    execute_scripts,
    pipelined,
)
from llm_testing.tls_redis import TlsRedis

pytestmark = pytest.mark.integration


def _client(url: str, timeout_s: float = 1.0) -> redis.asyncio.Redis:
    """A pooled client as services build them (the mux takes its endpoint from it)."""
    return redis.asyncio.Redis.from_url(
        url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s, decode_responses=True
    )


@pytest.fixture
async def mux(redis_client: redis.asyncio.Redis) -> AsyncIterator[RedisMux]:
    endpoint = Endpoint.of(redis_client)
    assert endpoint is not None
    m = RedisMux(endpoint)
    try:
        yield m
    finally:
        await m.aclose()


async def test_concurrent_calls_get_their_own_replies(
    mux: RedisMux, redis_client: redis.asyncio.Redis, redis_prefix: str
) -> None:
    async def one(i: int) -> None:
        key = f"{redis_prefix}mux:{i}"
        replies = await mux.execute(
            [["SET", key, f"v{i}"], ["INCRBY", key + ":n", i], ["GET", key]]
        )
        assert replies == ["OK", i, f"v{i}"]

    await asyncio.gather(*(one(i) for i in range(500)))
    # What the mux wrote is what an ordinary client reads (the same database).
    assert await redis_client.get(f"{redis_prefix}mux:499") == b"v499"
    assert await redis_client.get(f"{redis_prefix}mux:7:n") == b"7"


async def test_an_error_reply_belongs_to_its_command_only(mux: RedisMux, redis_prefix: str) -> None:
    key = f"{redis_prefix}mux:e"
    replies = await mux.execute(
        [["SET", key, "x"], ["INCR", key], ["EVALSHA", "0" * 40, 0], ["GET", key]]
    )
    assert replies[0] == "OK"
    assert isinstance(replies[1], ResponseError)
    assert isinstance(replies[2], NoScriptError)
    assert replies[3] == "x"


async def test_binary_values_come_back_as_bytes_without_decoding(
    redis_client: redis.asyncio.Redis, redis_prefix: str
) -> None:
    endpoint = Endpoint.of(redis_client)
    assert endpoint is not None
    raw = RedisMux(endpoint, decode=False)
    key, value = f"{redis_prefix}mux:bin", bytes(range(256))
    try:
        await redis_client.set(key, value)
        replies = await raw.execute([["GET", key], ["EVALSHA", "0" * 40, 0], ["PING"]])
        assert replies[0] == value
        assert isinstance(replies[1], NoScriptError)  # error replies are still recognised
        assert replies[2] == b"PONG"
    finally:
        await raw.aclose()


async def test_a_binary_reply_on_a_decoding_mux_fails_at_once(
    mux: RedisMux, redis_client: redis.asyncio.Redis, redis_prefix: str
) -> None:
    key = f"{redis_prefix}mux:bin"
    await redis_client.set(key, b"\xc8\xff")
    async with asyncio.timeout(0.5):  # well before the connection's timeout (the watchdog)
        with pytest.raises(RedisConnectionError):
            await mux.execute([["GET", key]])
    assert await mux.execute([["PING"]]) == ["PONG"]  # a new connection


async def test_a_killed_connection_fails_and_the_next_call_reconnects(
    mux: RedisMux, redis_client: redis.asyncio.Redis, redis_prefix: str
) -> None:
    (first_id,) = await mux.execute([["CLIENT", "ID"]])
    # A call in flight (BLPOP waits on Redis) when the connection is killed fails...
    blocked = asyncio.create_task(mux.execute([["BLPOP", f"{redis_prefix}never", 10]]))
    await asyncio.sleep(0.2)
    assert await redis_client.client_kill_filter(_id=first_id) == 1
    async with asyncio.timeout(5):
        with pytest.raises(RedisConnectionError):
            await blocked
    # ...and the next call gets a new connection.
    (second_id,) = await mux.execute([["CLIENT", "ID"]])
    assert second_id != first_id


async def test_auth_and_select_are_applied(private_redis: Callable[..., Any]) -> None:
    store = private_redis()
    admin = redis.asyncio.Redis.from_url(store.url, decode_responses=True)
    try:
        await admin.config_set("requirepass", "s3cret")
        url = f"redis://:s3cret@127.0.0.1:{store.port}/3"
        client = _client(url)
        hot = pipelined(client)
        assert isinstance(hot, RedisMux)
        try:
            assert await hot.execute([["SET", "k", "v"]]) == ["OK"]
            assert await client.get("k") == "v"  # db 3, as the URL says
        finally:
            await hot.aclose()
            await client.aclose()
    finally:
        await admin.aclose()


async def test_a_hung_redis_times_out_then_recovers(private_redis: Callable[..., Any]) -> None:
    store = private_redis()
    client = _client(store.url, timeout_s=0.3)
    hot = pipelined(client)
    try:
        assert await hot.execute([["PING"]]) == ["PONG"]
        store.process.send_signal(signal.SIGSTOP)
        try:
            async with asyncio.timeout(5):  # the watchdog must fire well before this
                with pytest.raises(RedisTimeoutError):
                    await hot.execute([["PING"]])
        finally:
            store.process.send_signal(signal.SIGCONT)
        assert await hot.execute([["PING"]]) == ["PONG"]
    finally:
        await hot.aclose()
        await client.aclose()


async def test_unreachable_redis_is_a_connection_error() -> None:
    client = _client("redis://127.0.0.1:1/0", timeout_s=0.3)
    hot = pipelined(client)
    try:
        with pytest.raises(RedisConnectionError):
            await hot.execute([["PING"]])
    finally:
        await hot.aclose()
        await client.aclose()


@pytest.fixture
def tls_redis(tmp_path: Path) -> Iterator[TlsRedis]:
    try:
        server = TlsRedis(tmp_path)
    except RuntimeError:
        pytest.skip("this redis-server has no TLS")
    yield server
    server.stop()


async def test_tls_urls_get_the_mux_with_the_clients_certificates(tls_redis: TlsRedis) -> None:
    client = _client(tls_redis.url)
    hot = pipelined(client)
    try:
        assert isinstance(hot, RedisMux)
        replies = await hot.execute(
            [["SET", "tls:k", "v"], ["GET", "tls:k"]], wait=ReplicaWait(0, 100)
        )
        assert replies == ["OK", "v"]
    finally:
        await hot.aclose()
        await client.aclose()


async def test_a_tls_server_the_client_does_not_trust_is_refused(tls_redis: TlsRedis) -> None:
    client = _client(f"rediss://127.0.0.1:{tls_redis.port}/0")  # the system CAs only
    hot = pipelined(client)
    try:
        with pytest.raises(RedisConnectionError):
            await hot.execute([["PING"]])
    finally:
        await hot.aclose()
        await client.aclose()


async def test_the_pool_answers_in_place(redis_client: redis.asyncio.Redis) -> None:
    replies = await PoolPipeline(redis_client).execute([["PING"], ["EVALSHA", "0" * 40, 0]])
    assert replies[0] in ("PONG", True)
    assert isinstance(replies[1], NoScriptError)


async def test_execute_scripts_loads_an_unknown_script_and_sends_again(
    mux: RedisMux, redis_client: redis.asyncio.Redis, redis_prefix: str
) -> None:
    # A script body no one has loaded: Redis answers NOSCRIPT, as after a restart.
    body = f"return ARGV[1] .. '{redis_prefix}'"
    sha = hashlib.sha1(body.encode()).hexdigest()
    loads = 0

    async def load() -> None:
        nonlocal loads
        loads += 1
        assert await redis_client.script_load(body) == sha

    replies = await execute_scripts(mux, [["EVALSHA", sha, 0, "x"]], load, idempotent=False)
    assert replies == [f"x{redis_prefix}"]
    assert loads == 1


@pytest.mark.parametrize("idempotent", [True, False])
async def test_execute_scripts_resends_after_a_lost_connection_only_if_idempotent(
    mux: RedisMux, redis_client: redis.asyncio.Redis, redis_prefix: str, idempotent: bool
) -> None:
    key = f"{redis_prefix}mux:resend"
    (first_id,) = await mux.execute([["CLIENT", "ID"]])

    async def no_scripts() -> None:
        raise AssertionError("nothing to load")

    call = asyncio.create_task(
        execute_scripts(mux, [["BLPOP", key, 5]], no_scripts, idempotent=idempotent)
    )
    await asyncio.sleep(0.2)  # the BLPOP is waiting on the first connection
    assert await redis_client.client_kill_filter(_id=first_id) == 1
    if not idempotent:
        with pytest.raises(RedisConnectionError):
            await asyncio.wait_for(call, 5)
        return
    await asyncio.sleep(0.2)  # sent again, on a new connection
    await redis_client.rpush(key, "v")
    assert await asyncio.wait_for(call, 5) == [[key, "v"]]
