"""The router over the real stack: tokenizer, two inference replicas with the real engine,
billing and auth on the real Redis. Streaming vs unary, exact billing, cancellation, prefix
affinity and deadlines (quotas, the output guard and the error paths: test_generation_policies)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

from .conftest import (
    HOLDING,
    MODEL,
    Router,
    Stack,
    cancel_while_generating,
    deployment,
    router_settings,
    running_router,
    wait_for,
    with_deployments,
)
from .generation_helpers import bypass, generation_router, sampling, stream_text, usage_of, user

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
LENGTH = common_pb2.FINISH_REASON_LENGTH


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def router(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Router]:
    async with generation_router(stack, tmp_path_factory.mktemp("router")) as running:
        yield running


async def test_health_is_serving(router: Router) -> None:
    reply = await health_pb2_grpc.HealthStub(router.server.channel).Check(
        health_pb2.HealthCheckRequest(service="llmapi.llm.v1.LLMService")
    )
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_streaming_and_unary_are_equal_for_the_same_seed(
    router: Router, stack: Stack
) -> None:
    caller = await stack.tenant()
    params = sampling(temperature=0.8, seed=1234, max_tokens=24, ignore_eos=True)
    messages = [user("Tell me a story about a fox.")]
    unary = await router.stub.Chat(
        pb.ChatRequest(model="demo", messages=messages, sampling=params, cache=bypass()),
        metadata=caller.metadata,
    )
    text, chunks = await stream_text(
        router,
        caller,
        pb.ChatStreamRequest(model="demo", messages=messages, sampling=params, cache=bypass()),
    )
    assert unary.message.content
    assert text == unary.message.content
    assert unary.model == MODEL
    assert unary.finish_reason == LENGTH
    last = chunks[-1]
    assert last.finish_reason == LENGTH
    # Equal but for cached_tokens: the second request found the prompt in the prefix cache.
    assert _counts(last.usage) == _counts(unary.usage)
    assert last.usage.cached_tokens >= 16
    assert unary.usage.completion_tokens == 24
    assert unary.usage.total_tokens == unary.usage.prompt_tokens + 24
    assert all(c.finish_reason == common_pb2.FINISH_REASON_UNSPECIFIED for c in chunks[:-1])
    assert chunks[0].cache.hit == pb.CACHE_HIT_MISS
    assert {c.request_id for c in chunks} == {chunks[0].request_id}
    # Completion: the same equality for a raw prompt.
    raw = pb.CompleteRequest(
        model=MODEL, prompt="Once upon a time", sampling=params, cache=bypass()
    )
    done = await router.stub.Complete(raw, metadata=caller.metadata)
    streamed = [
        m
        async for m in router.stub.CompleteStream(
            pb.CompleteStreamRequest(
                model=MODEL, prompt="Once upon a time", sampling=params, cache=bypass()
            ),
            metadata=caller.metadata,
        )
    ]
    assert "".join(m.delta for m in streamed) == done.text
    assert _counts(streamed[-1].usage) == _counts(done.usage)


def _counts(usage: common_pb2.Usage) -> tuple[int, int, int]:
    return usage.prompt_tokens, usage.completion_tokens, usage.total_tokens


async def test_settles_the_exact_usage_at_billing(router: Router, stack: Stack) -> None:
    caller = await stack.tenant()
    reply = await router.stub.Chat(
        pb.ChatRequest(
            model="demo",
            messages=[user("hi")],
            sampling=sampling(max_tokens=5, ignore_eos=True),
            cache=bypass(),
        ),
        metadata=caller.metadata,
    )

    async def settled() -> billing_pb.UsageBucket | None:
        total = await usage_of(stack, caller.tenant)
        return total if total.requests == 1 else None

    total = await wait_for(settled)
    assert total.prompt_tokens == reply.usage.prompt_tokens
    assert total.completion_tokens == 5
    assert total.cost_micros > 0


async def test_cancel_mid_stream_frees_kv_blocks_and_bills_partial_tokens(
    router: Router, stack: Stack
) -> None:
    caller = await stack.tenant()
    await wait_for(stack.idle)
    generated_before = stack.generated_tokens()
    request = pb.ChatStreamRequest(
        model="demo",
        messages=[user("Count slowly.")],
        sampling=sampling(max_tokens=900, ignore_eos=True, temperature=0.0),
        cache=bypass(),
    )
    call = router.stub.ChatStream(request, metadata=caller.metadata)
    received = 0
    async for message in call:
        received += len(message.delta)
        if received >= 5:
            break
    call.cancel()

    await wait_for(stack.idle)

    async def billed() -> billing_pb.UsageBucket | None:
        total = await usage_of(stack, caller.tenant)
        return total if total.requests == 1 else None

    total = await wait_for(billed)
    assert 0 < total.completion_tokens < 900
    # Exactly what the replica generated: the tokens it held for a fuller message (the
    # router stops the stream instead of cancelling it) and those in flight included.
    assert total.completion_tokens == stack.generated_tokens() - generated_before
    assert (
        router.metric("llm_router_requests_finished_total", model=MODEL, finish_reason="cancelled")
        >= 1
    )


async def test_a_cancelled_stream_is_billed_the_tokens_its_replica_was_holding(
    stack: Stack, tmp_path: Path
) -> None:
    catalog = with_deployments(stack.catalog, deployment("demo-local", stack.replica_addrs[:1]))
    settings = router_settings(stack, tmp_path, routing=HOLDING)
    async with running_router(settings, catalog) as router:
        caller = await stack.tenant()
        billed, generated = await cancel_while_generating(
            router, stack, caller.tenant, caller.metadata
        )
    assert 20 < billed < 900
    assert billed == generated


async def test_repeated_prefixes_land_on_the_same_replica(router: Router, stack: Stack) -> None:
    caller = await stack.tenant()
    system = common_pb2.ChatMessage(
        role=common_pb2.ROLE_SYSTEM, content="You are a careful assistant. " * 12
    )
    before = {
        r: router.metric(
            "llm_router_routing_decisions_total", model=MODEL, replica=r, reason="affinity"
        )
        for r in stack.replica_addrs
    }
    cached = []
    for i in range(4):
        reply = await router.stub.Chat(
            pb.ChatRequest(
                model="demo",
                messages=[system, user(f"question number {i}")],
                sampling=sampling(max_tokens=2, ignore_eos=True),
                cache=bypass(),
            ),
            metadata=caller.metadata,
        )
        cached.append(reply.usage.cached_tokens)
    after = {
        r: router.metric(
            "llm_router_routing_decisions_total", model=MODEL, replica=r, reason="affinity"
        )
        for r in stack.replica_addrs
    }
    gained = {r: after[r] - before[r] for r in stack.replica_addrs}
    # The first request placed the prefix; the next three followed it to the same replica...
    assert sorted(gained.values()) == [0.0, 3.0]
    # ... where the engine's prefix cache served the shared blocks.
    assert all(c >= 16 for c in cached[1:])


async def test_the_callers_deadline_reaches_the_replica(router: Router, stack: Stack) -> None:
    caller = await stack.tenant()
    request = pb.ChatRequest(
        model="demo",
        messages=[user("Take your time.")],
        sampling=sampling(max_tokens=900, ignore_eos=True),
        cache=bypass(),
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await router.stub.Chat(request, metadata=caller.metadata, timeout=0.3)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # The replica stopped generating (its call carried the same deadline) ...
    await wait_for(stack.idle)

    # ... and what it produced before the deadline is billed.
    async def billed() -> billing_pb.UsageBucket | None:
        total = await usage_of(stack, caller.tenant)
        return total if total.requests == 1 else None

    total = await wait_for(billed)
    assert total.completion_tokens < 900
