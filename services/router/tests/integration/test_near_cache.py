"""The router's near cache on the real cache service: a repeated exact hit is served by the
router itself and reported back to the cache; a change on the cache reaches the router
before the copy is served again; with the near cache off every hit asks the cache."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry, Counter

from llm_common.channels import make_channel
from llm_router.cache.near import NearCacheSettings
from llm_router.cache.near_feed import HitReporter
from llm_router.clients.cache import CacheClient
from llm_testing import free_port
from llmapi.cache.v1 import cache_service_pb2 as cache_pb
from llmapi.cache.v1 import cache_service_pb2_grpc as cache_grpc
from llmapi.llm.v1 import llm_service_pb2 as pb

from .conftest import (
    Router,
    Stack,
    deployment,
    running_router,
    wait_for,
    with_deployments,
)
from .test_cache import chat, generated, lookup_first, stored

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def router(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Router]:
    catalog = with_deployments(stack.catalog, deployment("d", stack.replica_addrs))
    settings = dataclasses.replace(
        lookup_first(stack, tmp_path_factory.mktemp("r")),
        near_cache=NearCacheSettings(report_interval_s=0.05),
    )
    async with running_router(settings, catalog) as r:
        assert r.runtime.near is not None
        feed = r.runtime.near.feed

        async def live() -> bool:
            return feed.live

        await wait_for(live)
        yield r


def near(router: Router, event: str) -> float:
    return router.metric("llm_router_near_cache_total", event=event)


async def test_a_repeated_hit_is_served_by_the_router_and_reported(
    router: Router, stack: Stack
) -> None:
    caller = await stack.tenant()
    request = chat("Where do otters sleep?", temperature=0.0)
    first = await router.stub.Chat(request, metadata=caller.metadata)
    assert first.cache.hit == pb.CACHE_HIT_MISS
    await stored(stack, caller.tenant, 1)
    hits_before, before = near(router, "hit"), generated(router)
    remote_hits = []

    async def kept_on_its_way_back() -> bool:
        # A hit from the cache service is kept by the router, unless the store's own change
        # reached it while the lookup was in flight (then the next hit is kept).
        stored_before = near(router, "stored")
        remote = await router.stub.Chat(request, metadata=caller.metadata)
        assert remote.cache.hit == pb.CACHE_HIT_EXACT
        remote_hits.append(remote)
        return near(router, "stored") > stored_before

    await wait_for(kept_on_its_way_back)
    assert near(router, "hit") == hits_before
    kept = await router.stub.Chat(request, metadata=caller.metadata)
    assert kept.cache.hit == pb.CACHE_HIT_EXACT
    assert kept.message.content == first.message.content
    assert kept.usage.cached_tokens == kept.usage.prompt_tokens  # billed as a hit
    assert near(router, "hit") == hits_before + 1
    assert generated(router) == before
    # Another tenant's identical request is not served from this tenant's copy.
    other = await stack.tenant()
    assert (await router.stub.Chat(request, metadata=other.metadata)).cache.hit == (
        pb.CACHE_HIT_MISS
    )
    # The cache counts the router's hit in its stats (RecordHits).
    stub = cache_grpc.CacheServiceStub(stack.cache.channel)

    async def reported() -> bool:
        stats = await stub.Stats(cache_pb.StatsRequest(tenant_id=caller.tenant))
        return stats.near_hits == 1 and stats.exact_hits == len(remote_hits) + 1

    await wait_for(reported)


async def test_an_invalidated_entry_is_not_served_again(router: Router, stack: Stack) -> None:
    caller = await stack.tenant()
    request = chat("Do herons fish at night?", temperature=0.0)
    await router.stub.Chat(request, metadata=caller.metadata)
    await stored(stack, caller.tenant, 1)
    for _ in range(2):  # the second from the router's copy
        assert (await router.stub.Chat(request, metadata=caller.metadata)).cache.hit == (
            pb.CACHE_HIT_EXACT
        )
    dropped = near(router, "invalidated")
    stub = cache_grpc.CacheServiceStub(stack.cache.channel)
    removed = await stub.Invalidate(cache_pb.InvalidateRequest(tenant_id=caller.tenant))
    assert removed.removed == 1

    async def heard() -> bool:
        return near(router, "invalidated") == dropped + 1

    await wait_for(heard)
    again = await router.stub.Chat(request, metadata=caller.metadata)
    assert again.cache.hit == pb.CACHE_HIT_MISS


async def test_a_lost_feed_empties_the_near_cache(router: Router, stack: Stack) -> None:
    caller = await stack.tenant()
    request = chat("Can moles swim?", temperature=0.0)
    await router.stub.Chat(request, metadata=caller.metadata)
    await stored(stack, caller.tenant, 1)
    await router.stub.Chat(request, metadata=caller.metadata)  # kept
    assert router.runtime.near is not None
    feed = router.runtime.near.feed
    await feed.stop()
    try:
        hits = near(router, "hit")
        reply = await router.stub.Chat(request, metadata=caller.metadata)
        assert reply.cache.hit == pb.CACHE_HIT_EXACT  # from the cache service
        assert near(router, "hit") == hits
    finally:
        feed.start()


async def test_hits_not_reported_are_kept_for_the_next_round(stack: Stack) -> None:
    events = Counter("near", "near-cache events", ["event"], registry=CollectorRegistry())
    dead = make_channel(f"127.0.0.1:{free_port()}", retry_unavailable=False)
    live = make_channel(stack.cache.target, retry_unavailable=False)
    caller = await stack.tenant()
    entry = "e" * 32
    try:
        down = HitReporter(CacheClient(dead, 1.0, None), events, interval_s=60, timeout_s=1.0)
        for _ in range(3):
            down.record(caller.tenant, entry)
        await down.flush()
        assert down.pending == 3  # kept, not lost
        assert events.labels("report_failed")._value.get() == 1
        up = HitReporter(CacheClient(live, 1.0, None), events, interval_s=60, timeout_s=1.0)
        up.record(caller.tenant, entry)
        await up.flush()
        assert up.pending == 0
        stats = await cache_grpc.CacheServiceStub(stack.cache.channel).Stats(
            cache_pb.StatsRequest(tenant_id=caller.tenant)
        )
        assert stats.near_hits == 1
    finally:
        await dead.close()
        await live.close()
