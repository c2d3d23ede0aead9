"""Logical ledger snapshots for disaster recovery: every key under the prefix as JSON lines.

Format: a header line, one line per key (relative name, type, remaining TTL, value), and a
trailer with the key count and a SHA-256 over the key lines; restore verifies the trailer
before writing anything. Each key is read atomically, the whole ledger is not: take the
snapshot while the ledger is quiet (or rely on Redis RDB/AOF for point-in-time copies),
and restore with the billing service stopped.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, TextIO

import redis.asyncio

FORMAT = "llm-billing-snapshot"
VERSION = 1
BATCH = 500
TYPES = ("string", "hash", "zset", "set")


class SnapshotError(Exception):
    """The snapshot cannot be written or restored (the message says why)."""


async def export_snapshot(client: redis.asyncio.Redis, prefix: str, out: TextIO) -> int:
    """Write every key under `prefix` to `out`; returns the number of keys."""
    digest, count = hashlib.sha256(), 0
    _write(out, {"format": FORMAT, "version": VERSION, "prefix": prefix, "created_ms": _now()})
    async for batch in _key_batches(client, prefix):
        for entry in await _read_batch(client, prefix, batch):
            line = json.dumps(entry, sort_keys=True, separators=(",", ":"))
            digest.update(line.encode())
            out.write(line + "\n")
            count += 1
    _write(out, {"end": True, "keys": count, "sha256": digest.hexdigest()})
    return count


async def restore_snapshot(
    client: redis.asyncio.Redis, prefix: str, source: Path, *, force: bool = False
) -> int:
    """Write a verified snapshot's keys under `prefix`; returns the number of keys.

    Refuses when keys under `prefix` exist, unless `force` (then each restored key replaces
    its namesake; other existing keys stay)."""
    count = verify_snapshot(source)
    if not force and await _any_key(client, prefix):
        raise SnapshotError(f"keys under {prefix!r} exist; restore into an empty ledger or force")
    batch: list[dict[str, Any]] = []
    for entry in _entries(source):
        batch.append(entry)
        if len(batch) >= BATCH:
            await _write_batch(client, prefix, batch)
            batch = []
    await _write_batch(client, prefix, batch)
    return count


def verify_snapshot(source: Path) -> int:
    """Check header, trailer, key count and checksum; returns the number of keys."""
    digest, count, trailer = hashlib.sha256(), 0, None
    try:
        with source.open(encoding="utf-8") as lines:
            _check_header(next(lines, ""))
            for line in lines:
                if trailer is not None:
                    raise SnapshotError("data after the trailer")
                if line.startswith('{"end"'):
                    trailer = json.loads(line)
                    continue
                digest.update(line.rstrip("\n").encode())
                count += 1
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SnapshotError(f"cannot read {source}: {exc}") from exc
    if trailer is None:
        raise SnapshotError("no trailer: the snapshot is truncated")
    if trailer.get("keys") != count or trailer.get("sha256") != digest.hexdigest():
        raise SnapshotError("key count or checksum mismatch: the snapshot is damaged")
    return count


def _check_header(line: str) -> None:
    try:
        header = json.loads(line)
    except json.JSONDecodeError:
        header = None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise SnapshotError("not a billing snapshot")
    if header.get("version") != VERSION:
        raise SnapshotError(f"unsupported snapshot version {header.get('version')!r}")


def _entries(source: Path) -> Iterator[dict[str, Any]]:
    with source.open(encoding="utf-8") as lines:
        next(lines)
        for line in lines:
            if not line.startswith('{"end"'):
                yield json.loads(line)


def _write(out: TextIO, record: dict[str, Any]) -> None:
    out.write(json.dumps(record, sort_keys=True, separators=(",", ":")) + "\n")


def _now() -> int:
    return time.time_ns() // 1_000_000


async def _key_batches(client: redis.asyncio.Redis, prefix: str) -> AsyncIterator[list[str]]:
    batch: list[str] = []
    async for key in client.scan_iter(match=f"{prefix}*", count=BATCH):
        batch.append(key)
        if len(batch) >= BATCH:
            yield batch
            batch = []
    if batch:
        yield batch


async def _any_key(client: redis.asyncio.Redis, prefix: str) -> bool:
    async for _ in client.scan_iter(match=f"{prefix}*", count=BATCH):
        return True
    return False


async def _read_batch(
    client: redis.asyncio.Redis, prefix: str, keys: list[str]
) -> list[dict[str, Any]]:
    async with client.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.type(key)
        types = await pipe.execute()
    async with client.pipeline(transaction=False) as pipe:
        for key, kind in zip(keys, types, strict=True):
            pipe.pttl(key)
            if kind == "stream":
                pipe.xlen(key)
            else:
                _queue_read(pipe, key, kind)
        replies = await pipe.execute()
    entries = []
    for i, (key, kind) in enumerate(zip(keys, types, strict=True)):
        ttl, value = replies[2 * i], replies[2 * i + 1]
        if kind == "none" or ttl == -2:  # deleted between SCAN and read
            continue
        if kind == "stream":  # the usage outbox: drain it to the store before exporting
            continue
        entries.append(
            {"key": key[len(prefix) :], "type": kind, "pttl": ttl, "value": _plain(kind, value)}
        )
    return entries


def _queue_read(pipe: Any, key: str, kind: str) -> None:
    readers = {
        "string": lambda: pipe.get(key),
        "hash": lambda: pipe.hgetall(key),
        "zset": lambda: pipe.zrange(key, 0, -1, withscores=True),
        "set": lambda: pipe.smembers(key),
    }
    if kind not in readers and kind != "none":
        raise SnapshotError(f"unexpected {kind} key {key!r} under the ledger prefix")
    readers.get(kind, lambda: pipe.exists(key))()


def _plain(kind: str, value: Any) -> Any:
    if kind == "zset":
        return [[member, _score(score)] for member, score in value]
    if kind == "set":
        return sorted(value)
    return value


def _score(score: float) -> int | float:
    return int(score) if score.is_integer() else score


async def _write_batch(
    client: redis.asyncio.Redis, prefix: str, entries: list[dict[str, Any]]
) -> None:
    if not entries:
        return
    async with client.pipeline(transaction=False) as pipe:
        for entry in entries:
            _queue_write(pipe, prefix + entry["key"], entry)
        await pipe.execute()


def _queue_write(pipe: Any, key: str, entry: dict[str, Any]) -> None:
    kind, value = entry["type"], entry["value"]
    if kind not in TYPES:
        raise SnapshotError(f"unsupported key type {kind!r}")
    pipe.delete(key)
    if kind == "string":
        pipe.set(key, value)
    elif kind == "hash" and value:
        pipe.hset(key, mapping=value)
    elif kind == "zset" and value:
        pipe.zadd(key, {member: score for member, score in value})
    elif kind == "set" and value:
        pipe.sadd(key, *value)
    if entry["pttl"] > 0:
        pipe.pexpire(key, entry["pttl"])
