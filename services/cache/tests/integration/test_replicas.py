"""Several replicas on one Redis: the index is rebuilt at start and follows the others'
stores and removals through the change log."""

from __future__ import annotations

import asyncio

import pytest

from llmapi.cache.v1 import cache_service_pb2 as pb

pytestmark = pytest.mark.integration

STORED = "How can I learn to play the guitar quickly?"
PARAPHRASE = "What is the quickest way to learn to play the guitar?"


async def _eventually(check, timeout_s: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_a_new_replica_rebuilds_its_index_from_redis(make_settings, serve_cache, req) -> None:
    settings = make_settings()
    async with serve_cache(settings) as first:
        await first.stub.Store(req.store(req.key(STORED)))
        await first.stub.Store(req.store(req.key("exact only", ids=[4, 2])))
        await first.stub.Store(req.store(req.key("Private question"), no_semantic_index=True))

    async with serve_cache(settings) as second:  # ready: rebuild finished
        assert second.app.engine is not None
        assert second.app.engine.indexed == 1
        found = await second.stub.Lookup(req.lookup(req.key(PARAPHRASE), threshold=0.7))
        assert found.kind == pb.HIT_KIND_SEMANTIC


async def test_replicas_follow_each_others_stores_and_removals(
    make_settings, serve_cache, req
) -> None:
    settings = make_settings()
    async with serve_cache(settings) as one, serve_cache(settings) as two:
        entry = (await one.stub.Store(req.store(req.key(STORED)))).entry_id

        async def two_hits() -> bool:
            found = await two.stub.Lookup(req.lookup(req.key(PARAPHRASE), threshold=0.7))
            return found.kind == pb.HIT_KIND_SEMANTIC

        await _eventually(two_hits)

        await one.stub.Invalidate(pb.InvalidateRequest(tenant_id="tenant-a", entry_id=entry))

        async def two_forgot() -> bool:
            return two.app.engine is not None and entry not in two.app.engine

        await _eventually(two_forgot)
