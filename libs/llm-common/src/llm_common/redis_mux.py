"""One auto-pipelined Redis connection for a service's hot path (billing's Reserve/Settle).

redis-py spends more CPU per call than Redis spends running the ledger scripts (a pooled
connection taken and given back under a timeout, a retry wrapper, command objects). Here
every caller writes its commands to one shared connection at once, and one reader task
hands the replies back in order (Redis answers a connection's commands in order), so a call
costs a write and a future, and concurrent calls share socket reads and writes.

Failure model: a lost connection fails every call in flight with ConnectionError (the
ledger's operations are idempotent, so the caller retries), and the next call reconnects.
When Redis sends nothing for `timeout_s` while a call waits, the connection is closed the
same way (TimeoutError), so a hung Redis cannot hold calls forever; a watchdog checks the
oldest call, not every call.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import hiredis
import redis.asyncio
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

READ_CHUNK = 65536
Command = Sequence[str | int]


class Pipelined(Protocol):
    """Sends commands together; replies in order, error replies as exception objects."""

    async def execute(self, commands: Sequence[Command]) -> list[Any]: ...

    async def aclose(self) -> None: ...


def pipelined(client: redis.asyncio.Redis, *, decode: bool = True) -> Pipelined:
    """RedisMux on the client's endpoint, or the client's own pool where RedisMux can't go.
    `decode=False`: bulk replies stay bytes (binary values); the pool replies as the client
    was configured to."""
    endpoint = Endpoint.of(client)
    return PoolPipeline(client) if endpoint is None else RedisMux(endpoint, decode=decode)


@dataclass(frozen=True, slots=True)
class Endpoint:
    """Where and how to connect, taken from a redis-py client's pool."""

    host: str
    port: int
    path: str  # a unix socket when set
    db: int
    username: str | None
    password: str | None
    timeout_s: float

    @classmethod
    def of(cls, client: redis.asyncio.Redis) -> Endpoint | None:
        """The endpoint of `client`, or None when it needs what this module lacks (TLS)."""
        pool = client.connection_pool
        kwargs = pool.connection_kwargs
        kind = pool.connection_class
        if kind not in (redis.asyncio.Connection, redis.asyncio.UnixDomainSocketConnection):
            return None
        return cls(
            host=str(kwargs.get("host", "localhost")),
            port=int(kwargs.get("port", 6379)),
            path=str(kwargs.get("path", "")),
            db=int(kwargs.get("db", 0)),
            username=kwargs.get("username"),
            password=kwargs.get("password"),
            timeout_s=float(kwargs.get("socket_timeout") or 5.0),
        )


class _Link:
    """One open connection: its writer, the futures awaiting replies, and its reader task."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, decode: bool
    ) -> None:
        self.writer = writer
        self.pending: deque[tuple[asyncio.Future[Any], float]] = deque()
        self.closed = False
        self.last_read = time.monotonic()
        self._out: list[bytes] = []
        self._flush_soon = False
        encoding = "utf-8" if decode else None
        self._parser = hiredis.Reader(encoding=encoding, replyError=ResponseError)
        self.task = asyncio.create_task(self._read(reader), name="redis-mux-reader")

    def send(self, commands: Sequence[Command]) -> list[asyncio.Future[Any]]:
        """Queue the commands; they are written with everything else queued in this turn of
        the event loop (one write for many concurrent calls)."""
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        futures = [loop.create_future() for _ in commands]
        self.pending.extend((f, now) for f in futures)
        # hiredis's stub types the argument as a 1-tuple; it takes any number of parts.
        self._out.extend(hiredis.pack_command(tuple(c)) for c in commands)  # type: ignore[arg-type]
        if not self._flush_soon:
            self._flush_soon = True
            loop.call_soon(self._flush)
        return futures

    def _flush(self) -> None:
        self._flush_soon = False
        if not self.closed:
            self.writer.write(b"".join(self._out))
        self._out.clear()

    def fail(self, error: Exception) -> None:
        """Close the connection and fail every call still waiting for a reply."""
        if self.closed:
            return
        self.closed = True
        self.writer.transport.abort()  # nothing buffered is wanted: its calls are failed here
        while self.pending:
            future, _ = self.pending.popleft()
            if not future.done():
                future.set_exception(error)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while data := await reader.read(READ_CHUNK):
                if self.closed:  # failed meanwhile: its calls have their answer already
                    return
                self.last_read = time.monotonic()
                self._parser.feed(data)
                while (reply := self._parser.gets()) is not False:
                    if not self.pending:  # a reply nobody waits for: out of step, give up
                        self.fail(RedisConnectionError("unexpected reply from Redis"))
                        return
                    self._deliver(reply)
            self.fail(RedisConnectionError("Redis closed the connection"))
        except (OSError, hiredis.ProtocolError) as exc:
            self.fail(RedisConnectionError(f"Redis connection lost: {type(exc).__name__}"))
        except UnicodeDecodeError:  # binary data on a decoding mux: fail now, not at the timeout
            self.fail(RedisConnectionError("undecodable reply (use decode=False for binary)"))

    def _deliver(self, reply: Any) -> None:
        future, _ = self.pending.popleft()
        if future.done():  # its caller was cancelled; the reply is simply dropped
            return
        if isinstance(reply, ResponseError):
            if str(reply).startswith("NOSCRIPT"):
                reply = NoScriptError(str(reply))
            future.set_exception(reply)
        else:
            future.set_result(reply)


class PoolPipeline:
    """The same interface on redis-py's pool, for what RedisMux does not speak (TLS)."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._client = client

    async def execute(self, commands: Sequence[Command]) -> list[Any]:
        async with self._client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            return list(await pipe.execute(raise_on_error=False))

    async def aclose(self) -> None:
        """Nothing of its own to close: the pool belongs to the client."""


class RedisMux:
    """Auto-pipelined calls on one lazily opened connection (see the module docstring)."""

    def __init__(self, endpoint: Endpoint, *, decode: bool = True) -> None:
        self._endpoint = endpoint
        self._decode = decode  # False: bulk replies are bytes
        self._link: _Link | None = None
        self._connecting = asyncio.Lock()
        self._watchdog: asyncio.Task[None] | None = None

    async def execute(self, commands: Sequence[Command]) -> list[Any]:
        """Send `commands` together; their replies in order, error replies as exception
        objects (like a redis-py pipeline with raise_on_error=False). A connection failure
        raises ConnectionError or TimeoutError."""
        link = self._link
        if link is None or link.closed:
            link = await self._connect()
        futures = link.send(commands)
        if link.writer.transport.get_write_buffer_size() > READ_CHUNK:
            await link.writer.drain()  # back-pressure only when Redis lags behind
        replies = []
        for future in futures:
            try:
                replies.append(await future)
            except ResponseError as exc:
                replies.append(exc)
        return replies

    async def aclose(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
            self._watchdog = None
        if self._link is not None:
            link, self._link = self._link, None
            link.fail(RedisConnectionError("closed"))
            link.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await link.task

    async def _connect(self) -> _Link:
        async with self._connecting:
            if self._link is not None and not self._link.closed:
                return self._link
            ep = self._endpoint
            try:
                async with asyncio.timeout(ep.timeout_s):
                    link = _Link(*await self._open(ep), decode=self._decode)
                    await self._handshake(link, ep)
            except (OSError, TimeoutError) as exc:
                raise RedisConnectionError(
                    f"cannot connect to Redis: {type(exc).__name__}"
                ) from exc
            self._link = link
            if self._watchdog is None:
                self._watchdog = asyncio.create_task(self._watch(), name="redis-mux-watchdog")
            return link

    @staticmethod
    async def _open(ep: Endpoint) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if ep.path:
            return await asyncio.open_unix_connection(ep.path)
        return await asyncio.open_connection(ep.host, ep.port)

    @staticmethod
    async def _handshake(link: _Link, ep: Endpoint) -> None:
        commands: list[Command] = []
        if ep.password is not None:
            auth = [ep.username, ep.password] if ep.username else [ep.password]
            commands.append(["AUTH", *auth])
        if ep.db:
            commands.append(["SELECT", ep.db])
        try:
            for future in link.send(commands):
                await future
        except ResponseError:
            link.fail(RedisConnectionError("handshake refused"))
            raise

    async def _watch(self) -> None:
        """Fail the connection when its oldest call has waited longer than the timeout."""
        timeout_s = self._endpoint.timeout_s
        while True:
            await asyncio.sleep(min(timeout_s / 2, 1.0))
            link = self._link
            if link is not None and link.pending:
                now = time.monotonic()
                # Silent for the whole timeout while a call waited: not merely a busy loop.
                silent = now - max(link.pending[0][1], link.last_read)
                if silent > timeout_s:
                    link.fail(RedisTimeoutError(f"no reply from Redis in {timeout_s} s"))


async def execute_scripts(
    hot: Pipelined,
    commands: Sequence[Command],
    load_scripts: Callable[[], Awaitable[None]],
    *,
    idempotent: bool,
) -> list[Any]:
    """`commands` (EVALSHA and others) in one round trip, error replies in place.

    A script Redis does not know (NOSCRIPT: it restarted or flushed its scripts) did not run:
    the scripts are loaded and the commands sent again; the other commands of the pipeline
    did run, so callers that are not `idempotent` send one script per call. After a lost
    connection the commands are sent once more only when `idempotent`: any of them may have
    run before the connection broke."""
    for attempt in range(3):
        try:
            replies = await hot.execute(commands)
        except RedisConnectionError:
            if attempt or not idempotent:
                raise
            continue
        if not any(isinstance(reply, NoScriptError) for reply in replies):
            return replies
        await load_scripts()
    return replies


async def eval_script(
    hot: Pipelined,
    sha: str,
    keys: Sequence[str],
    args: Sequence[str | int],
    load_scripts: Callable[[], Awaitable[None]],
) -> Any:
    """One script by its SHA: loaded again after NOSCRIPT, never resent after a lost
    connection (see execute_scripts); an error reply is raised."""
    command: Command = ["EVALSHA", sha, len(keys), *keys, *args]
    (reply,) = await execute_scripts(hot, [command], load_scripts, idempotent=False)
    if isinstance(reply, Exception):
        raise reply
    return reply
