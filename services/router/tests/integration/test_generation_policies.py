"""The router over the real stack (tokenizer, two inference replicas with the real engine,
billing and auth on the real Redis): token quotas, the output guard, identity and scopes, the
error paths that need a tokenizer, token counting, model auto-pick, the token memo and what the
access log leaves out."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio

from llm_common.errors import parse_error
from llm_router.api.identity import Caller as RouterCaller
from llm_router.safety.policies import parse_policies
from llm_router.tokens.attestation import AttestationSettings
from llm_testing import LogCapture
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

from .conftest import (
    MODEL,
    Caller,
    Router,
    Stack,
    deployment,
    router_settings,
    running_router,
    wait_for,
    with_deployments,
)
from .generation_helpers import bypass, generation_router, sampling, stream_text, usage_of, user

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def router(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Router]:
    async with generation_router(stack, tmp_path_factory.mktemp("router")) as running:
        yield running


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
