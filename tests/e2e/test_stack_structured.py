"""Structured outputs, tool calls, n and logprob alternatives with the official `openai` SDK
through the edge, on the random demo model (constrained decoding makes the shape hold)."""

from __future__ import annotations

import json
import time

import grpc
import jsonschema
import openai
import pytest
from google.protobuf import timestamp_pb2
from pydantic import BaseModel, Field

from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.billing.v1 import billing_service_pb2_grpc as billing_grpc

from .conftest import RunningStack

pytestmark = pytest.mark.e2e
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": WEATHER,
            "strict": True,
        },
    }
]
FORCED = {"type": "function", "function": {"name": "get_weather"}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


class Address(BaseModel):
    city: str = Field(max_length=12)
    zip_code: str = Field(pattern=r"^[0-9]{5}$")


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int = Field(ge=0, le=120)
    address: Address


def client(stack: RunningStack, key: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=stack.endpoints.openai_base_url, api_key=key, max_retries=0, timeout=120
    )


def test_parse_returns_a_validated_nested_model(stack: RunningStack) -> None:
    completion = client(stack, stack.demo_key).chat.completions.parse(
        model="demo",
        messages=[{"role": "user", "content": "Invent a person."}],
        response_format=Person,
        max_tokens=400,
        seed=1,
        extra_body={"cache": {"bypass": True}},
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice
    person = choice.message.parsed
    assert isinstance(person, Person)
    assert isinstance(person.address, Address)


def test_a_forced_call_validates_and_the_stream_reassembles_to_it(stack: RunningStack) -> None:
    api = client(stack, stack.demo_key)
    unary = api.chat.completions.create(
        model="demo", messages=ASK, tools=TOOLS, tool_choice=FORCED, seed=5, max_tokens=400
    )
    choice = unary.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert len(calls) == 1
    assert calls[0].type == "function"
    function = calls[0].function  # type: ignore[union-attr]
    assert function.name == "get_weather"
    jsonschema.validate(json.loads(function.arguments), WEATHER)
    stream = api.chat.completions.create(
        model="demo",
        messages=ASK,
        tools=TOOLS,
        tool_choice=FORCED,
        seed=5,
        max_tokens=400,
        stream=True,
    )
    ids, names, arguments, finish = [], [], [], None
    for chunk in stream:
        for delta in chunk.choices[0].delta.tool_calls or []:
            if delta.id:
                ids.append(delta.id)
            if delta.function and delta.function.name:
                names.append(delta.function.name)
            if delta.function and delta.function.arguments:
                arguments.append(delta.function.arguments)
        finish = chunk.choices[0].finish_reason or finish
    # Ids are per response (derived from its request id); the call itself is identical.
    assert len(ids) == 1
    assert ids[0].startswith("call_")
    assert names == ["get_weather"]
    assert "".join(arguments) == function.arguments
    assert finish == "tool_calls"


def test_a_tool_result_continues_the_conversation(stack: RunningStack) -> None:
    api = client(stack, stack.demo_key)
    first = api.chat.completions.create(
        model="demo", messages=ASK, tools=TOOLS, tool_choice="required", seed=2, max_tokens=400
    )
    message = first.choices[0].message
    calls = message.tool_calls or []
    assert calls
    conversation = [
        *ASK,
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": calls[0].id, "content": '{"temperature": 21}'},
    ]
    reply = api.chat.completions.create(
        model="demo", messages=conversation, tools=TOOLS, max_tokens=8, seed=2
    )
    assert reply.usage is not None
    assert first.usage is not None
    assert reply.usage.prompt_tokens > first.usage.prompt_tokens


def _billed_requests(stack: RunningStack, tenant: str) -> int:
    now = int(time.time())
    request = billing_pb.GetUsageRequest(
        tenant_id=tenant,
        start_time=timestamp_pb2.Timestamp(seconds=now - 3600),
        end_time=timestamp_pb2.Timestamp(seconds=now + 3600),
        granularity=billing_pb.GRANULARITY_TOTAL,
    )
    with grpc.insecure_channel(stack.edge) as channel:
        reply = billing_grpc.BillingServiceStub(channel).GetUsage(
            request, metadata=(("authorization", f"Bearer {stack.admin_key}"),), timeout=10
        )
    return int(reply.total.requests)


def test_n_returns_every_choice_and_bills_them_all(stack: RunningStack) -> None:
    key = stack.create_key(tenant="e2e-n-choices", name="n choices")
    reply = client(stack, key).chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "Say something."}],
        n=3,
        max_tokens=4,
        temperature=1.0,
        extra_body={"ignore_eos": True, "cache": {"bypass": True}},
    )
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert reply.usage is not None
    assert reply.usage.completion_tokens == 12
    deadline = time.monotonic() + 20  # settlement runs after the answer
    while _billed_requests(stack, "e2e-n-choices") < 3:
        assert time.monotonic() < deadline, "not every choice was billed"
        time.sleep(0.2)


def test_top_logprobs_give_five_alternatives_per_token(stack: RunningStack) -> None:
    reply = client(stack, stack.demo_key).chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "Hello"}],
        max_tokens=4,
        logprobs=True,
        top_logprobs=5,
        extra_body={"ignore_eos": True, "cache": {"bypass": True}},
    )
    content = reply.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None
    assert len(content) == 4
    for token in content:
        assert len(token.top_logprobs) == 5
        assert token.bytes


def test_litellm_gets_a_forced_call_and_a_parsed_json_answer(
    stack: RunningStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Offline: litellm must read its bundled model-cost map instead of fetching one.
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    common: dict[str, object] = {
        "model": "openai/demo",
        "api_base": stack.endpoints.openai_base_url,
        "api_key": stack.demo_key,
        "max_retries": 0,
        "timeout": 120,
    }
    reply = litellm.completion(
        # Room for the random model's whitespace between JSON tokens (up to 16 each).
        messages=ASK,
        tools=TOOLS,
        tool_choice=FORCED,
        seed=9,
        max_tokens=400,
        **common,
    )
    calls = reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "tool_calls"
    assert calls[0].function.name == "get_weather"
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER)
    answer = litellm.completion(
        messages=[{"role": "user", "content": "Invent a person."}],
        response_format=Person,
        max_tokens=400,
        seed=4,
        **common,
    )
    if answer.choices[0].finish_reason == "stop":
        Person.model_validate_json(answer.choices[0].message.content)
