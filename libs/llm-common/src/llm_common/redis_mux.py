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
import ssl
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

from llm_common.redis_tls import plain_or_tls, speaks_tls, tls_context

READ_CHUNK = 65536
Command = Sequence[str | int]


@dataclass(frozen=True, slots=True)
class ReplicaWait:
    """`WAIT replicas timeout_ms` after the commands: they are acknowledged only once that
    many replicas have them (a failover then cannot lose them)."""

    replicas: int
    timeout_ms: int


class ReplicaWaitError(RedisTimeoutError):
    """Fewer replicas than asked for confirmed the writes in time; they did run (and may be
    lost on a failover), so the caller retries an idempotent operation or reports it."""


class Pipelined(Protocol):
    """Sends commands together; replies in order, error replies as exception objects.
    With `wait`, the replies come once `wait.replicas` replicas have the writes
    (ReplicaWaitError when they do not in time)."""

    async def execute(
        self, commands: Sequence[Command], *, wait: ReplicaWait | None = None
    ) -> list[Any]: ...

    async def aclose(self) -> None: ...


def pipelined(client: redis.asyncio.Redis, *, decode: bool = True) -> Pipelined:
    """RedisMux on the client's endpoint (ClusterMux, one RedisMux per master, for a
    RedisCluster), or the client's own pool where RedisMux can't go. `decode=False`: bulk
    replies stay bytes (binary values); the pool replies as the client was configured to."""
    from llm_common.redis_cluster_mux import ClusterMux, cluster_of, mux_speaks

    cluster = cluster_of(client)  # (that module imports this one: imported here)
    if cluster is not None:
        return ClusterMux(cluster, decode=decode) if mux_speaks(cluster) else PoolPipeline(client)
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
    tls: ssl.SSLContext | None = None  # rediss://: the client's own certificates and checks

    @classmethod
    def of(cls, client: redis.asyncio.Redis) -> Endpoint | None:
        """The endpoint of `client`, or None when it needs what this module lacks."""
        pool = client.connection_pool
        kwargs = pool.connection_kwargs
        kind = pool.connection_class
        if not plain_or_tls(kind):
            return None
        return cls(
            host=str(kwargs.get("host", "localhost")),
            port=int(kwargs.get("port", 6379)),
            path=str(kwargs.get("path", "")),
            db=int(kwargs.get("db", 0)),
            username=kwargs.get("username"),
            password=kwargs.get("password"),
            timeout_s=float(kwargs.get("socket_timeout") or 5.0),
            tls=tls_context(kwargs) if speaks_tls(kind) else None,
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
        self._wait: ReplicaWait | None = None  # a WAIT to write after this turn's commands
        self._wait_future: asyncio.Future[Any] | None = None
        encoding = "utf-8" if decode else None
        self._parser = hiredis.Reader(encoding=encoding, replyError=ResponseError)
        self.task = asyncio.create_task(self._read(reader), name="redis-mux-reader")

    def send_waiting(
        self, commands: Sequence[Command], wait: ReplicaWait
    ) -> tuple[list[asyncio.Future[Any]], asyncio.Future[Any]]:
        """Queue the commands (see send) and one WAIT after everything queued in this turn:
        concurrent callers share it (WAIT covers every earlier write of the connection), so
        a burst costs one replica round trip, not one each. The commands' futures and the
        WAIT's."""
        futures = self.send(commands)
        if self._wait is None or self._wait_future is None:
            self._wait = wait
            self._wait_future = asyncio.get_running_loop().create_future()
        elif (wait.replicas, wait.timeout_ms) > (self._wait.replicas, self._wait.timeout_ms):
            self._wait = wait
        return futures, self._wait_future

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
        if self._wait is not None and self._wait_future is not None:
            wait, future = self._wait, self._wait_future
            self._wait = self._wait_future = None
            if self.closed:
                future.set_exception(RedisConnectionError("Redis connection lost"))
            else:
                self.pending.append((future, time.monotonic()))
                command = ("WAIT", wait.replicas, wait.timeout_ms)
                self._out.append(hiredis.pack_command(command))  # type: ignore[arg-type]
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


@dataclass(frozen=True, slots=True)
class Sent:
    """Futures of queued commands (and of the WAIT after them)."""

    futures: list[asyncio.Future[Any]]
    acked: asyncio.Future[Any] | None

    def forget(self) -> None:
        """Mark the failed futures' errors as seen (one error is raised for all)."""
        _retrieve([*self.futures, *([] if self.acked is None else [self.acked])])


class PoolPipeline:
    """The same interface on redis-py's pool, for what RedisMux does not speak (TLS)."""

    def __init__(self, client: redis.asyncio.Redis) -> None:
        self._client = client

    async def execute(
        self, commands: Sequence[Command], *, wait: ReplicaWait | None = None
    ) -> list[Any]:
        async with self._client.pipeline(transaction=False) as pipe:
            for command in commands:
                pipe.execute_command(*command)
            if wait is not None:  # on the same connection, after the writes
                pipe.execute_command("WAIT", wait.replicas, wait.timeout_ms)
            replies = list(await pipe.execute(raise_on_error=False))
        if wait is not None:
            check_acked(replies.pop(), wait)
        return replies

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

    async def execute(
        self, commands: Sequence[Command], *, wait: ReplicaWait | None = None
    ) -> list[Any]:
        """Send `commands` together; their replies in order, error replies as exception
        objects (like a redis-py pipeline with raise_on_error=False). A connection failure
        raises ConnectionError or TimeoutError; with `wait`, too few replicas in time raise
        ReplicaWaitError."""
        return await self.collect(await self.send(commands, wait=wait), wait)

    async def send(self, commands: Sequence[Command], *, wait: ReplicaWait | None = None) -> Sent:
        """Queue `commands` (connecting first if needed); `collect` awaits their replies.
        Split so that ClusterMux can queue on every master before awaiting any."""
        link = self._link
        if link is None or link.closed:
            link = await self._connect()
        acked: asyncio.Future[Any] | None = None
        if wait is None:
            futures = link.send(commands)
        else:
            futures, acked = link.send_waiting(commands, wait)
        if link.writer.transport.get_write_buffer_size() > READ_CHUNK:
            await link.writer.drain()  # back-pressure only when Redis lags behind
        return Sent(futures, acked)

    @staticmethod
    async def collect(sent: Sent, wait: ReplicaWait | None = None) -> list[Any]:
        """The replies of what `send` queued, error replies as exception objects."""
        replies = []
        try:
            for future in sent.futures:
                try:
                    replies.append(await future)
                except ResponseError as exc:
                    replies.append(exc)
            if sent.acked is not None and wait is not None:
                check_acked(await sent.acked, wait)
        except RedisConnectionError:
            sent.forget()
            raise
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
        if ep.tls is not None:
            hostname = ep.host if ep.tls.check_hostname else None
            return await asyncio.open_connection(
                ep.host, ep.port, ssl=ep.tls, server_hostname=hostname
            )
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


def _retrieve(futures: Sequence[asyncio.Future[Any]]) -> None:
    """Mark the failed futures' errors as seen (one connection error is raised for all)."""
    for future in futures:
        if future.done():
            _seen(future)
        else:  # its reply (or error) comes after the caller has given up on it
            future.add_done_callback(_seen)


def _seen(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def check_acked(reply: Any, wait: ReplicaWait) -> None:
    """Raise ReplicaWaitError unless WAIT's `reply` counts `wait.replicas` replicas."""
    if isinstance(reply, Exception):
        raise reply
    if int(reply) < wait.replicas:
        raise ReplicaWaitError(
            f"{reply} of {wait.replicas} replicas confirmed in {wait.timeout_ms} ms"
        )


async def execute_scripts(
    hot: Pipelined,
    commands: Sequence[Command],
    load_scripts: Callable[[], Awaitable[None]],
    *,
    idempotent: bool,
    wait: ReplicaWait | None = None,
) -> list[Any]:
    """`commands` (EVALSHA and others) in one round trip, error replies in place.

    A script Redis does not know (NOSCRIPT: it restarted or flushed its scripts) did not run:
    the scripts are loaded and the commands sent again; the other commands of the pipeline
    did run, so callers that are not `idempotent` send one script per call. After a lost
    connection the commands are sent once more only when `idempotent`: any of them may have
    run before the connection broke."""
    for attempt in range(3):
        try:
            replies = await hot.execute(commands, wait=wait)
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
