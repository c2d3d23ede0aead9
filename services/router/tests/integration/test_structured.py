"""Structured outputs, tool calls, n and logprob alternatives through the router over the real
stack (tokenizer, two replicas running the random demo model, billing, auth)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import jsonschema
import pytest
import pytest_asyncio

from llm_common.errors import parse_error
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

from .conftest import (
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
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 10},
        "address": {"$ref": "#/$defs/address"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
    },
    "required": ["name", "address", "tags"],
    "additionalProperties": False,
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["zip"],
            "additionalProperties": False,
        }
    },
}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def router(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Router]:
    catalog = with_deployments(stack.catalog, deployment("demo-local", stack.replica_addrs))
    settings = router_settings(stack, tmp_path_factory.mktemp("router"))
    async with running_router(settings, catalog) as running:
        await wait_for(lambda: _fresh(running, stack))
        yield running


async def _fresh(router: Router, stack: Stack) -> bool:
    return all(router.runtime.board.health(r) == "fresh" for r in stack.replica_addrs)


def user(text: str) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)


def weather_tool() -> common_pb2.Tool:
    return common_pb2.Tool(
        type="function",
        function=common_pb2.FunctionDefinition(
            name="get_weather",
            description="Weather forecast for a city",
            parameters_json=json.dumps(WEATHER),
            strict=True,
        ),
    )


def chat(**fields: Any) -> pb.ChatRequest:
    fields.setdefault("model", "demo")
    fields.setdefault("messages", [user("What is the weather in Paris?")])
    fields.setdefault("cache", pb.CachePolicy(bypass=True))
    return pb.ChatRequest(**fields)


def forced(**sampling: Any) -> pb.ChatRequest:
    sampling.setdefault("max_tokens", 200)
    return chat(
        tools=[weather_tool()],
        tool_choice=common_pb2.ToolChoice(function_name="get_weather"),
        sampling=common_pb2.SamplingParams(**sampling),
    )


async def test_a_forced_call_validates_and_streams_to_the_same_call(
    router: Router, stack: Stack
) -> None:
    caller = await stack.tenant()
    request = forced(temperature=0.9, seed=7)
    unary = await router.stub.Chat(request, metadata=caller.metadata)
    assert unary.finish_reason == common_pb2.FINISH_REASON_TOOL_CALLS
    (call,) = unary.message.tool_calls
    assert call.function.name == "get_weather"
    assert call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    stream_request = pb.ChatStreamRequest()
    stream_request.ParseFromString(request.SerializeToString())
    messages = [m async for m in router.stub.ChatStream(stream_request, metadata=caller.metadata)]
    deltas = [d for m in messages for d in m.tool_calls]
    assert deltas[0].id
    assert deltas[0].name == "get_weather"
    assert "".join(d.arguments for d in deltas) == call.function.arguments
    assert messages[-1].finish_reason == common_pb2.FINISH_REASON_TOOL_CALLS


async def test_a_tool_result_continues_the_conversation(router: Router, stack: Stack) -> None:
    caller = await stack.tenant()
    first = await router.stub.Chat(forced(temperature=0.0), metadata=caller.metadata)
    (call,) = first.message.tool_calls
    answer = common_pb2.ChatMessage(
        role=common_pb2.ROLE_TOOL, tool_call_id=call.id, content='{"forecast": "sunny"}'
    )
    follow_up = chat(
        messages=[user("What is the weather in Paris?"), first.message, answer],
        tools=[weather_tool()],
        sampling=common_pb2.SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
    )
    reply = await router.stub.Chat(follow_up, metadata=caller.metadata)
    assert reply.usage.prompt_tokens > first.usage.prompt_tokens
    assert reply.usage.completion_tokens == 8


async def test_json_schema_output_validates(router: Router, stack: Stack) -> None:
    caller = await stack.tenant()
    params = common_pb2.SamplingParams(
        temperature=1.0,
        seed=3,
        max_tokens=300,
        format=common_pb2.OutputFormat(json_schema=json.dumps(PERSON)),
    )
    reply = await router.stub.Chat(chat(sampling=params), metadata=caller.metadata)
    assert reply.finish_reason in (common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH)
    if reply.finish_reason == common_pb2.FINISH_REASON_STOP:
        jsonschema.validate(json.loads(reply.message.content), PERSON)


async def test_n_choices_are_returned_billed_and_share_the_prompt(
    router: Router, stack: Stack
) -> None:
    # Earlier tests' leftovers (a cancelled stream still winding down) would make the first
    # choice's replica look busy and send a sibling to the other, cold replica.
    await wait_for(stack.idle, timeout_s=30)
    caller = await stack.tenant()
    params = common_pb2.SamplingParams(temperature=1.0, seed=11, max_tokens=6, ignore_eos=True, n=3)
    # A prompt of several KV blocks no earlier test sent: only the siblings can find it cached.
    ask = user(f"{caller.tenant} " + "Tell me about the lighthouse keeper and the sea. " * 8)
    reply = await router.stub.Chat(chat(messages=[ask], sampling=params), metadata=caller.metadata)
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert reply.message.content == reply.choices[0].message.content
    assert reply.usage.completion_tokens == 18
    usage = await billed(stack, caller.tenant, 3)
    assert usage.completion_tokens == 18
    assert usage.prompt_tokens == 3 * reply.usage.prompt_tokens
    # Choices 2 and 3 reuse the first one's full prompt blocks (prefilled once, then shared).
    full_blocks = (reply.usage.prompt_tokens - 1) // 16 * 16
    assert full_blocks >= 64
    assert usage.cached_tokens >= 2 * full_blocks
    stream_request = pb.ChatStreamRequest()
    stream_request.ParseFromString(chat(messages=[ask], sampling=params).SerializeToString())
    messages = [m async for m in router.stub.ChatStream(stream_request, metadata=caller.metadata)]
    for index, choice in enumerate(reply.choices):
        text = "".join(m.delta for m in messages if m.index == index)
        assert text == choice.message.content  # each choice is reproducible from its seed
    assert [m.usage.completion_tokens for m in messages if m.HasField("usage")] == [18]


async def test_top_logprobs_come_with_their_bytes(router: Router, stack: Stack) -> None:
    caller = await stack.tenant()
    params = common_pb2.SamplingParams(
        temperature=0.7, seed=5, max_tokens=5, ignore_eos=True, logprobs=True, top_logprobs=5
    )
    reply = await router.stub.Chat(chat(sampling=params), metadata=caller.metadata)
    assert len(reply.logprobs) == 5
    for token in reply.logprobs:
        assert len(token.top_logprobs) == 5
        assert token.bytes
        assert token.top_logprobs[0].logprob >= token.top_logprobs[-1].logprob
        assert token.logprob <= token.top_logprobs[0].logprob + 1e-5


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"tool_choice": common_pb2.ToolChoice(function_name="nope")}, "tool_choice.function_name"),
        (
            {
                "messages": [
                    user("hi"),
                    common_pb2.ChatMessage(role=common_pb2.ROLE_TOOL, content="x"),
                ]
            },
            "messages[1].tool_call_id",
        ),
        ({"tools": [weather_tool()] * 129}, "tools"),
        (
            {
                "tools": [
                    common_pb2.Tool(
                        function=common_pb2.FunctionDefinition(name="f", parameters_json="[1]")
                    )
                ]
            },
            "tools[0].function.parameters_json",
        ),
        ({"sampling": common_pb2.SamplingParams(n=17)}, "sampling.n"),
        ({"sampling": common_pb2.SamplingParams(logit_bias={1: 101.0})}, "sampling.logit_bias[1]"),
    ],
)
async def test_bad_tool_and_sampling_fields_are_invalid_argument(
    router: Router, stack: Stack, fields: dict[str, Any], field: str
) -> None:
    caller = await stack.tenant()
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await router.stub.Chat(chat(**fields), metadata=caller.metadata)
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in {v.field for v in parse_error(failed.value).field_violations}


async def test_an_unsupported_schema_keyword_is_named_and_the_router_stays_healthy(
    router: Router, stack: Stack
) -> None:
    caller = await stack.tenant()
    schema = {"type": "object", "properties": {"a": {"not": {"type": "string"}}}}
    params = common_pb2.SamplingParams(
        max_tokens=20, format=common_pb2.OutputFormat(json_schema=json.dumps(schema))
    )
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await router.stub.Chat(chat(sampling=params), metadata=caller.metadata)
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    violations = parse_error(failed.value).field_violations
    assert any("not" in v.description for v in violations), violations
    ok = await router.stub.Chat(
        chat(sampling=common_pb2.SamplingParams(max_tokens=3)), metadata=caller.metadata
    )
    assert ok.usage.completion_tokens >= 1
