"""The response cache through the router (real cache service on Redis): exact hits replayed
without touching a replica and billed as cached; what is never cached; a cache outage."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from llm_router.config import Settings
from llm_testing import free_port
from llmapi.cache.v1 import cache_service_pb2 as cache_pb
from llmapi.cache.v1 import cache_service_pb2_grpc as cache_grpc
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

from .conftest import (
    MODEL,
    Caller,
    Router,
    Stack,
    billed,
    deployment,
    router_settings,
    running_router,
    wait_for,
    with_deployments,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def router(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Router]:
    catalog = with_deployments(stack.catalog, deployment("d", stack.replica_addrs))
    async with running_router(lookup_first(stack, tmp_path_factory.mktemp("r")), catalog) as r:
        yield r


def lookup_first(stack: Stack, workdir: Path) -> Settings:
    """A generous lookup grace and no speculation: generation never starts before the cache
    has answered."""
    return router_settings(stack, workdir, lookup_grace_s=5.0, speculate_below_hit_rate=0.0)


def chat(text: str, **sampling: object) -> pb.ChatRequest:
    params = common_pb2.SamplingParams(max_tokens=6, ignore_eos=True, **sampling)  # type: ignore[arg-type]
    return pb.ChatRequest(
        model="demo",
        messages=[common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)],
        sampling=params,
    )


def generated(router: Router) -> float:
    return sum(
        router.metric("llm_router_routing_decisions_total", model=MODEL, replica=r, reason=reason)
        for r in router.runtime.board._replicas
        for reason in ("load", "affinity", "imbalance", "unknown_load")
    )


async def stored(stack: Stack, tenant: str, count: int) -> None:
    stub = cache_grpc.CacheServiceStub(stack.cache.channel)

    async def done() -> bool:
        return (await stub.Stats(cache_pb.StatsRequest(tenant_id=tenant))).entries >= count

    await wait_for(done)


async def test_exact_hit_is_replayed_without_a_replica_and_billed_as_cached(
    router: Router, stack: Stack
) -> None:
    caller = await stack.tenant()
    first = await router.stub.Chat(
        chat("What is a fox?", temperature=0.0), metadata=caller.metadata
    )
    assert first.cache.hit == pb.CACHE_HIT_MISS
    await stored(stack, caller.tenant, 1)
    before = generated(router)
    again = await router.stub.Chat(
        chat("What is a fox?", temperature=0.0), metadata=caller.metadata
    )
    assert again.cache.hit == pb.CACHE_HIT_EXACT
    assert again.cache.similarity == pytest.approx(1.0)
    assert again.message.content == first.message.content
    assert again.usage.completion_tokens == first.usage.completion_tokens
    assert again.usage.cached_tokens == again.usage.prompt_tokens
    streamed = [
        m
        async for m in router.stub.ChatStream(
            pb.ChatStreamRequest(
                model="demo",
                messages=again_messages("What is a fox?"),
                sampling=chat("x", temperature=0.0).sampling,
            ),
            metadata=caller.metadata,
        )
    ]
    assert streamed[0].cache.hit == pb.CACHE_HIT_EXACT
    assert "".join(m.delta for m in streamed) == first.message.content
    assert generated(router) == before  # no replica was asked
    total = await billed(stack, caller.tenant, 3)
    # The two hits are billed at the cached-input price for their whole prompt.
    assert total.cached_tokens == 2 * first.usage.prompt_tokens
    assert total.completion_tokens == 3 * first.usage.completion_tokens


def again_messages(text: str) -> list[common_pb2.ChatMessage]:
    return [common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)]


async def test_what_is_never_cached(router: Router, stack: Stack) -> None:
    caller = await stack.tenant()
    # Sampled without a seed: neither looked up nor stored, unless the caller opts in.
    for _ in range(2):
        reply = await router.stub.Chat(
            chat("Tell a joke.", temperature=0.9), metadata=caller.metadata
        )
        assert reply.cache.hit == pb.CACHE_HIT_MISS
    # Bypass: not even a greedy repeat is served from the cache.
    await router.stub.Chat(chat("Repeat me.", temperature=0.0), metadata=caller.metadata)
    await stored(stack, caller.tenant, 1)
    bypass = chat("Repeat me.", temperature=0.0)
    bypass.cache.bypass = True
    assert (await router.stub.Chat(bypass, metadata=caller.metadata)).cache.hit == pb.CACHE_HIT_MISS
    # A seeded sample is reproducible, hence cacheable.
    await router.stub.Chat(chat("Seeded.", temperature=0.9, seed=5), metadata=caller.metadata)
    await stored(stack, caller.tenant, 2)
    hit = await router.stub.Chat(chat("Seeded.", temperature=0.9, seed=5), metadata=caller.metadata)
    assert hit.cache.hit == pb.CACHE_HIT_EXACT
    # Another tenant never sees these entries.
    other = await stack.tenant()
    miss = await router.stub.Chat(chat("Seeded.", temperature=0.9, seed=5), metadata=other.metadata)
    assert miss.cache.hit == pb.CACHE_HIT_MISS


async def test_cache_outage_is_a_miss(stack: Stack, tmp_path: Path) -> None:
    settings = router_settings(stack, tmp_path, cache=False)
    dead = f"127.0.0.1:{free_port()}"
    settings = settings.__class__(
        server=settings.server,
        downstream=settings.downstream.__class__(
            tokenizer_addr=settings.downstream.tokenizer_addr,
            billing_addr=settings.downstream.billing_addr,
            auth_addr=settings.downstream.auth_addr,
            cache_addr=dead,
            call_timeout_s=1.0,
        ),
        outbox_dir=settings.outbox_dir,
        routing=settings.routing,
    )
    catalog = with_deployments(stack.catalog, deployment("d", stack.replica_addrs))
    caller: Caller = await stack.tenant()
    async with running_router(settings, catalog) as router:
        for _ in range(2):
            reply = await router.stub.Chat(
                chat("Cache down?", temperature=0.0), metadata=caller.metadata
            )
            assert reply.cache.hit == pb.CACHE_HIT_MISS
            assert reply.usage.completion_tokens == 6
        assert router.metric("llm_router_cache_lookups_total", result="error") == 2


async def test_a_slow_lookup_does_not_hold_up_generation(stack: Stack, tmp_path: Path) -> None:
    # Grace 0: generation starts at once, alongside the lookup; a hit then cancels it.
    settings = router_settings(stack, tmp_path, lookup_grace_s=0.0)
    catalog = with_deployments(stack.catalog, deployment("d", stack.replica_addrs))
    caller = await stack.tenant()
    async with running_router(settings, catalog) as router:
        first = await router.stub.Chat(chat("Hedge?", temperature=0.0), metadata=caller.metadata)
        await stored(stack, caller.tenant, 1)
        again = await router.stub.Chat(chat("Hedge?", temperature=0.0), metadata=caller.metadata)
        assert again.cache.hit == pb.CACHE_HIT_EXACT
        assert again.message.content == first.message.content
        assert router.metric("llm_router_abandoned_generations_total", reason="cache_hit") == 1
