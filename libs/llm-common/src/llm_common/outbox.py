"""Durable local outbox: messages that could not be delivered, kept in SQLite (WAL) and
replayed with jittered exponential backoff; it survives a process restart."""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
import sqlite3
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from llm_common.logging import get_logger
from llm_common.resilience import Backoff

T = TypeVar("T")
MAX_ERROR_CHARS = 500
_SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    key TEXT PRIMARY KEY,
    payload BLOB NOT NULL,
    created_at REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at REAL NOT NULL,
    last_error TEXT,
    dead INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS outbox_due ON outbox (dead, next_attempt_at);
"""
_COLUMNS = "key, payload, created_at, attempts, next_attempt_at, last_error"
_log = get_logger(__name__)


class Delivery(enum.Enum):
    """What a send attempt says about one message."""

    DELIVERED = "delivered"  # done: remove it
    RETRY = "retry"  # transient failure: try again after a backoff
    REJECTED = "rejected"  # the receiver will never accept it: keep it as a dead letter


@dataclass(frozen=True, slots=True)
class OutboxItem:
    """A stored message; times are epoch seconds (wall clock, so they survive restarts)."""

    key: str
    payload: bytes
    created_at: float
    attempts: int
    next_attempt_at: float
    last_error: str | None


@dataclass(frozen=True, slots=True)
class ReplayStats:
    """What one replay pass did."""

    delivered: int = 0
    retried: int = 0
    rejected: int = 0


_DELETE_CHUNK = 500  # keys per DELETE, well under SQLite's bound-parameter limit


class OutboxFull(Exception):  # noqa: N818 - reads as a state: `except OutboxFull`
    """The outbox holds `max_items` messages; the new one was not stored."""


Send = Callable[[OutboxItem], Awaitable[Delivery]]


class Outbox:
    """A durable queue of messages keyed by an idempotency key, in one SQLite file.

    Use `await Outbox.open(path)`. All SQLite work runs on one worker thread, so the event
    loop never blocks on disk. One process should replay a given file at a time; `put` may
    be called from anywhere in that process. Dead letters (rejected messages) are kept,
    never dropped silently, until `drop_dead_letter`.
    """

    def __init__(
        self,
        connection: sqlite3.Connection,
        executor: ThreadPoolExecutor,
        *,
        backoff: Backoff,
        max_items: int,
        max_payload_bytes: int,
        clock: Callable[[], float],
        rng: random.Random | None,
    ) -> None:
        self._db = connection
        self._executor = executor
        self._backoff = backoff
        self._max_items = max_items
        self._max_payload_bytes = max_payload_bytes
        self._clock = clock
        self._rng = rng
        self._wakeup = asyncio.Event()
        self._closed = False

    @classmethod
    async def open(
        cls,
        path: Path,
        *,
        backoff: Backoff | None = None,
        max_items: int = 100_000,
        max_payload_bytes: int = 64 * 1024,
        synchronous: str = "FULL",
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> Outbox:
        """Open (creating if needed) the outbox at `path`, in WAL mode.

        `synchronous` FULL fsyncs every commit (survives power loss); NORMAL survives a
        process crash only. The default backoff retries after 0.5 s, 1 s, 2 s, ... up to
        60 s, each plus up to 0.5 s of jitter.
        """
        if max_items < 1 or max_payload_bytes < 1:
            raise ValueError("max_items and max_payload_bytes must be >= 1")
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError("synchronous must be FULL or NORMAL")
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox")
        loop = asyncio.get_running_loop()
        connection = await loop.run_in_executor(executor, _connect, path, synchronous)
        return cls(
            connection,
            executor,
            backoff=backoff or Backoff(base=0.5, cap=60.0, jitter=0.5),
            max_items=max_items,
            max_payload_bytes=max_payload_bytes,
            clock=clock,
            rng=rng,
        )

    async def put(self, key: str, payload: bytes) -> bool:
        """Store a message, due now; False when `key` is already stored (kept unchanged).

        OutboxFull when `max_items` messages are stored; ValueError for an empty key or an
        oversized payload."""
        if not key:
            raise ValueError("key must not be empty")
        if len(payload) > self._max_payload_bytes:
            raise ValueError(f"payload is larger than {self._max_payload_bytes} bytes")
        stored = await self._run(self._put, key, payload, self._clock())
        if stored:
            self._wakeup.set()
        return stored

    async def due(self, limit: int = 100) -> list[OutboxItem]:
        """Up to `limit` live messages whose next attempt is due, earliest first."""
        rows = await self._run(
            _query,
            self._db,
            f"SELECT {_COLUMNS} FROM outbox WHERE dead = 0 AND next_attempt_at <= ? "
            "ORDER BY next_attempt_at, created_at LIMIT ?",
            (self._clock(), limit),
        )
        return [OutboxItem(*row) for row in rows]

    async def pending(self) -> int:
        """Live (not dead) messages stored."""
        rows = await self._run(_query, self._db, "SELECT COUNT(*) FROM outbox WHERE dead = 0", ())
        return int(rows[0][0])

    async def dead_letters(self, limit: int = 100) -> list[OutboxItem]:
        """Rejected messages, oldest first."""
        rows = await self._run(
            _query,
            self._db,
            f"SELECT {_COLUMNS} FROM outbox WHERE dead = 1 ORDER BY created_at LIMIT ?",
            (limit,),
        )
        return [OutboxItem(*row) for row in rows]

    async def next_due_at(self) -> float | None:
        """When the earliest live message becomes due (epoch seconds), or None if empty."""
        rows = await self._run(
            _query, self._db, "SELECT MIN(next_attempt_at) FROM outbox WHERE dead = 0", ()
        )
        value = rows[0][0]
        return None if value is None else float(value)

    async def mark_delivered(self, *keys: str) -> None:
        """Remove delivered messages: many in one statement, so one sync to disk (a batch
        replay delivers up to hundreds at once)."""
        for start in range(0, len(keys), _DELETE_CHUNK):
            chunk = keys[start : start + _DELETE_CHUNK]
            marks = ",".join("?" * len(chunk))
            sql = f"DELETE FROM outbox WHERE key IN ({marks})"
            await self._run(_execute, self._db, sql, chunk)

    async def retry_later(self, item: OutboxItem, error: str) -> float:
        """Count a failed attempt and schedule the next one; returns the delay in seconds."""
        attempts = item.attempts + 1
        delay = self._backoff.delay(attempts, self._rng)
        await self._run(
            _execute,
            self._db,
            "UPDATE outbox SET attempts = ?, next_attempt_at = ?, last_error = ? WHERE key = ?",
            (attempts, self._clock() + delay, error[:MAX_ERROR_CHARS], item.key),
        )
        return delay

    async def reject(self, item: OutboxItem, error: str) -> None:
        """Keep a message the receiver refused as a dead letter (not replayed again)."""
        await self._run(
            _execute,
            self._db,
            "UPDATE outbox SET dead = 1, attempts = attempts + 1, last_error = ? WHERE key = ?",
            (error[:MAX_ERROR_CHARS], item.key),
        )

    async def drop_dead_letter(self, key: str) -> bool:
        """Delete one dead letter (after an operator dealt with it); False if none."""
        changed = await self._run(
            _execute, self._db, "DELETE FROM outbox WHERE key = ? AND dead = 1", (key,)
        )
        return changed > 0

    async def replay_once(self, send: Send, limit: int = 100) -> ReplayStats:
        """Send the due messages in order. The pass stops at the first RETRY: the receiver is
        probably down, and the backoff decides when to knock again."""
        delivered = retried = rejected = 0
        for item in await self.due(limit):
            outcome, error = await _attempt(send, item)
            if outcome is Delivery.DELIVERED:
                await self.mark_delivered(item.key)
                delivered += 1
            elif outcome is Delivery.REJECTED:
                await self.reject(item, error)
                rejected += 1
                _log.warning("outbox message rejected", key=item.key, error=error)
            else:
                delay = await self.retry_later(item, error)
                retried += 1
                _log.info("outbox delivery failed", attempts=item.attempts + 1, retry_in_s=delay)
                break
        return ReplayStats(delivered, retried, rejected)

    async def run(self, send: Send, stop: asyncio.Event, *, idle_poll_s: float = 1.0) -> None:
        """Replay until `stop` is set: whenever something is due, when `put` adds a message,
        and at least every `idle_poll_s` (other processes may have written to the file)."""
        while not stop.is_set():
            self._wakeup.clear()
            stats = await self.replay_once(send)
            if stats.delivered + stats.rejected > 0 and stats.retried == 0:
                continue  # more may be due right away
            await self._sleep(await self._wait_s(idle_poll_s), stop)

    async def close(self) -> None:
        """Close the database and its thread (stored messages stay on disk)."""
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._executor, self._db.close)
        self._executor.shutdown(wait=True)

    async def __aenter__(self) -> Outbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _wait_s(self, idle_poll_s: float) -> float:
        next_due = await self.next_due_at()
        if next_due is None:
            return idle_poll_s
        return max(0.0, min(idle_poll_s, next_due - self._clock()))

    async def _sleep(self, seconds: float, stop: asyncio.Event) -> None:
        waiters = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wakeup.wait())]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        if self._closed:
            raise RuntimeError("the outbox is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _put(self, key: str, payload: bytes, now: float) -> bool:
        with _transaction(self._db):
            (count,) = self._db.execute("SELECT COUNT(*) FROM outbox").fetchone()
            if self._db.execute("SELECT 1 FROM outbox WHERE key = ?", (key,)).fetchone():
                return False
            if count >= self._max_items:
                raise OutboxFull(f"the outbox holds {count} messages")
            self._db.execute(
                "INSERT INTO outbox (key, payload, created_at, next_attempt_at) "
                "VALUES (?, ?, ?, ?)",
                (key, payload, now, now),
            )
            return True


async def _attempt(send: Send, item: OutboxItem) -> tuple[Delivery, str]:
    try:
        return await send(item), ""
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a send that raises is a transient failure by definition
        return Delivery.RETRY, type(exc).__name__


def _connect(path: Path, synchronous: str) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Autocommit mode; multi-statement writes use explicit BEGIN IMMEDIATE transactions.
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
    if str(mode).lower() != "wal":
        db.close()
        raise RuntimeError(f"cannot put {path} in WAL mode (got {mode})")
    db.execute(f"PRAGMA synchronous={synchronous}")
    db.execute("PRAGMA busy_timeout=5000")
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version not in (0, _SCHEMA_VERSION):
        db.close()
        raise RuntimeError(f"{path} has outbox schema {version}, expected {_SCHEMA_VERSION}")
    with _transaction(db):
        _create_schema(db)
    return db


def _create_schema(db: sqlite3.Connection) -> None:
    for statement in _SCHEMA.split(";"):
        if statement.strip():
            db.execute(statement)
    db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def _query(db: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    return db.execute(sql, params).fetchall()


def _execute(db: sqlite3.Connection, sql: str, params: tuple[Any, ...]) -> int:
    return db.execute(sql, params).rowcount
