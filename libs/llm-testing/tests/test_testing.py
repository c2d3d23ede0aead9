"""Test helpers: a real Redis for tests (configured, local or embedded) and per-test prefixes."""

from __future__ import annotations

import redis
import redis.asyncio

from llm_testing import (
    delete_prefixed,
    free_port,
    redis_reachable,
    start_embedded_redis,
)


def test_redis_url_is_reachable(redis_url: str) -> None:
    assert redis_reachable(redis_url)


async def test_redis_client_and_prefix_cleanup(
    redis_client: redis.asyncio.Redis, redis_prefix: str
) -> None:
    assert redis_prefix.startswith("test:")
    assert redis_prefix.endswith(":")
    await redis_client.set("unrelated:{t1}:k", "keep")
    for i in range(3):
        await redis_client.set(f"{redis_prefix}{{t1}}:k{i}", "v")
    assert await redis_client.get(f"{redis_prefix}{{t1}}:k0") == b"v"
    assert await delete_prefixed(redis_client, redis_prefix) == 3
    assert await redis_client.get("unrelated:{t1}:k") == b"keep"
    await redis_client.delete("unrelated:{t1}:k")


def test_embedded_redis_starts_without_persistence_and_stops() -> None:
    embedded = start_embedded_redis()
    try:
        client = redis.Redis.from_url(embedded.url)
        assert client.ping()
        assert client.config_get("save")["save"] == ""
        assert client.config_get("appendonly")["appendonly"] == "no"
        client.close()
    finally:
        embedded.stop()
    assert not redis_reachable(embedded.url, timeout_s=0.2)
    assert not embedded.workdir.exists()


def test_unreachable_redis() -> None:
    assert not redis_reachable(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2)
