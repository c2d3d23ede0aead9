"""The router over the real stack: tokenizer, two inference replicas with the real engine,
billing and auth on the real Redis. Streaming vs unary, cancellation, prefix affinity,
quotas, budgets, the output guard and the error paths that need a tokenizer."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf import timestamp_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llm_common.errors import parse_error
from llm_router.api.identity import Caller as RouterCaller
from llm_router.safety.policies import parse_policies
from llm_router.tokens.attestation import AttestationSettings
from llm_testing import LogCapture
from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.billing.v1 import billing_service_pb2_grpc as billing_grpc
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

from .conftest import (
    HOLDING,
    MODEL,
    Caller,
    Router,
    Stack,
    cancel_while_generating,
    deployment,
    router_settings,
    running_router,
    wait_for,
    with_deployments,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
STOP = common_pb2.FINISH_REASON_STOP
LENGTH = common_pb2.FINISH_REASON_LENGTH


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def router(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Router]:
    catalog = with_deployments(stack.catalog, deployment("demo-local", stack.replica_addrs))
    settings = router_settings(stack, tmp_path_factory.mktemp("router"))
    async with running_router(settings, catalog) as running:
        # Load reports from both replicas before the first request.
        await wait_for(lambda: _fresh(running, stack))
        yield running


async def _fresh(router: Router, stack: Stack) -> bool:
    return all(router.runtime.board.health(r) == "fresh" for r in stack.replica_addrs)


def user(text: str) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)


def sampling(**kw: Any) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(**kw)


def bypass() -> pb.CachePolicy:
    return pb.CachePolicy(bypass=True)


async def usage_of(stack: Stack, tenant: str) -> billing_pb.UsageBucket:
    now = int(time.time())
    response = await billing_grpc.BillingServiceStub(stack.billing.channel).GetUsage(
        billing_pb.GetUsageRequest(
            tenant_id=tenant,
            start_time=timestamp_pb2.Timestamp(seconds=now - 7200),
            end_time=timestamp_pb2.Timestamp(seconds=now + 7200),
        )
    )
    return response.total


async def stream_text(
    router: Router, caller: Caller, request: pb.ChatStreamRequest
) -> tuple[str, list[pb.ChatStreamResponse]]:
    messages = [m async for m in router.stub.ChatStream(request, metadata=caller.metadata)]
    return "".join(m.delta for m in messages), messages


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


async def test_token_quota_is_enforced_with_quota_failure(router: Router, stack: Stack) -> None:
    caller = await stack.tenant(tokens_per_minute=60)
    request = pb.ChatRequest(
        model="demo", messages=[user("hello")], sampling=sampling(max_tokens=50), cache=bypass()
    )
    await router.stub.Chat(request, metadata=caller.metadata)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await router.stub.Chat(request, metadata=caller.metadata)
    details = parse_error(info.value)
    assert details.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details.quota_violations
    assert details.retry_after_s is not None
    assert details.retry_after_s > 0
    # Generation had started alongside admission; the refusal cancelled it, unbilled.
    await wait_for(stack.idle)

    async def one_billed() -> bool:
        return (await usage_of(stack, caller.tenant)).requests == 1

    await wait_for(one_billed)
    # A refused caller is admitted before generation starts until its RetryInfo is over.
    assert router.runtime.admitter.refusals.recent(
        RouterCaller(caller.tenant, caller.key, frozenset())
    )


async def test_phrase_split_across_tokens_is_caught(
    router: Router, stack: Stack, tmp_path: Path
) -> None:
    caller = await stack.tenant()
    request = pb.ChatStreamRequest(
        model="demo",
        messages=[user("Say something.")],
        sampling=sampling(temperature=0.0, max_tokens=40, ignore_eos=True),
        cache=bypass(),
    )
    text, _ = await stream_text(router, caller, request)
    words = text.split()
    assert len(words) >= 4, text
    # A phrase from the middle of the answer: it spans several tokens and deltas.
    phrase = " ".join(words[1:3])
    start = text.index(phrase)
    policies = parse_policies({"default": {"output": {"blocklist": [phrase]}}})
    catalog = with_deployments(stack.catalog, deployment("demo-local", stack.replica_addrs))
    async with running_router(router_settings(stack, tmp_path), catalog, policies) as guarded:
        filtered, messages = await stream_text(guarded, caller, request)
    assert messages[-1].finish_reason == common_pb2.FINISH_REASON_CONTENT_FILTER
    assert phrase not in filtered
    assert filtered == text[:start]
    # The tokens generated up to the stop are billed.
    assert 0 < messages[-1].usage.completion_tokens <= 40


async def test_errors_that_need_the_prompt_tokens(router: Router, stack: Stack) -> None:
    caller = await stack.tenant()
    too_long = pb.ChatRequest(
        model="demo", messages=[user("hi")], sampling=sampling(max_tokens=2048)
    )
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await router.stub.Chat(too_long, metadata=caller.metadata)
    details = parse_error(info.value)
    assert details.code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.field_violations[0].field == "sampling.max_tokens"
    unknown = pb.ChatRequest(model="gpt-99", messages=[user("hi")])
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await router.stub.Chat(unknown, metadata=caller.metadata)
    details = parse_error(info.value)
    assert details.code == grpc.StatusCode.NOT_FOUND
    assert details.resource == ("model", "gpt-99")
    # Nothing was reserved or billed for the refused requests, and the router still serves.
    assert (await usage_of(stack, caller.tenant)).requests == 0
    ok = await router.stub.Chat(
        pb.ChatRequest(model="demo", messages=[user("hi")], sampling=sampling(max_tokens=1)),
        metadata=caller.metadata,
    )
    assert ok.usage.completion_tokens == 1


async def test_identity_and_scopes(router: Router, stack: Stack) -> None:
    request = pb.ChatRequest(model="demo", messages=[user("hi")], sampling=sampling(max_tokens=1))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await router.stub.Chat(request)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    caller = await stack.tenant()
    reader = Caller(caller.tenant, caller.key, scopes="embedding:read")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await router.stub.Chat(request, metadata=reader.metadata)
    details = parse_error(info.value)
    assert details.code == grpc.StatusCode.PERMISSION_DENIED
    assert details.error_info is not None
    assert details.error_info.reason == "SCOPE_MISSING"


async def test_count_tokens_and_list_models(router: Router, stack: Stack) -> None:
    caller = await stack.tenant()
    counted = await router.stub.CountTokens(
        pb.CountTokensRequest(model="demo", messages=[user("hello there")]),
        metadata=caller.metadata,
    )
    reply = await router.stub.Chat(
        pb.ChatRequest(
            model="demo",
            messages=[user("hello there")],
            sampling=sampling(max_tokens=1),
            cache=bypass(),
        ),
        metadata=caller.metadata,
    )
    assert counted.tokens == reply.usage.prompt_tokens
    assert counted.context_length == 2048
    raw = await router.stub.CountTokens(
        pb.CountTokensRequest(model=MODEL, prompt="hello"), metadata=caller.metadata
    )
    assert raw.tokens >= 2  # BOS + the text
    models = await router.stub.ListModels(pb.ListModelsRequest(), metadata=caller.metadata)
    assert [(m.name, list(m.aliases), m.tier) for m in models.models] == [
        (MODEL, ["demo"], "small")
    ]
    assert list(models.models[0].regions) == ["local"]


async def test_access_log_has_no_prompt_text(
    router: Router, stack: Stack, json_logs: LogCapture
) -> None:
    caller = await stack.tenant()
    secret = "my-very-private-prompt-words"
    await router.stub.Chat(
        pb.ChatRequest(
            model="demo",
            messages=[user(secret)],
            sampling=sampling(max_tokens=3),
            cache=bypass(),
            user="alice",
        ),
        metadata=caller.metadata,
    )
    await asyncio.sleep(0.05)
    lines = json_logs.events("request")
    assert lines, json_logs.text
    assert lines[-1]["tenant"] == caller.tenant
    assert lines[-1]["completion_tokens"] == 3
    assert lines[-1]["replica"] in stack.replica_addrs
    assert secret not in json_logs.text
    assert "alice" not in json_logs.text


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


async def test_auto_picks_the_model_that_fits(router: Router, stack: Stack) -> None:
    caller = await stack.tenant()
    reply = await router.stub.Chat(
        pb.ChatRequest(
            model="auto", messages=[user("hi")], sampling=sampling(max_tokens=2), cache=bypass()
        ),
        metadata=caller.metadata,
    )
    assert reply.model == MODEL
    assert reply.usage.completion_tokens == 2
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await router.stub.Chat(
            pb.ChatRequest(model="auto", messages=[user("hi")], sampling=sampling(max_tokens=2047)),
            metadata=caller.metadata,
        )
    details = parse_error(info.value)
    assert details.code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.field_violations[0].field == "messages"


async def test_identical_prompts_skip_the_tokenizer_per_tenant(
    stack: Stack, tmp_path: Path
) -> None:
    # The memo holds the service's ids: it serves routers whose files the service does not
    # attest (here: never asked to), which confirm every prompt.
    settings = router_settings(stack, tmp_path)
    settings = dataclasses.replace(settings, attestation=AttestationSettings(interval_s=0.0))
    catalog = with_deployments(stack.catalog, deployment("demo-local", stack.replica_addrs))
    async with running_router(settings, catalog) as router:
        await _identical_prompts_skip_the_tokenizer(router, stack)


async def _identical_prompts_skip_the_tokenizer(router: Router, stack: Stack) -> None:
    first, second = await stack.tenant(), await stack.tenant()

    def memo(result: str) -> float:
        return router.metric("llm_router_token_memo_lookups_total", result=result)

    request = pb.ChatRequest(
        model="demo",
        messages=[user("A prompt asked twice, word for word.")],
        sampling=sampling(max_tokens=2, ignore_eos=True),
        cache=bypass(),
    )
    hits, misses = memo("hit"), memo("miss")
    replies = [
        await router.stub.Chat(request, metadata=caller.metadata)
        for caller in (first, first, second)
    ]
    # The repeat from the same tenant is answered from the memo; another tenant's identical
    # prompt is not (the memo is per tenant), and every answer counts the same prompt.
    assert memo("hit") - hits == 1
    assert memo("miss") - misses == 2
    assert len({reply.usage.prompt_tokens for reply in replies}) == 1
    assert replies[0].usage.prompt_tokens > 0
