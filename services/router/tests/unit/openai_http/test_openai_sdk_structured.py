"""The official openai SDK's structured-output and tool helpers against this layer, in process.

An httpx transport stands in for the network: each request body goes through translate
(as the listener does), a scripted model answers the LLMService request, and the answer
goes back through responses / chunks. So what the SDK sends must translate, and what the
layer answers must satisfy `parse`, `stream` and pydantic."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import httpx2
import openai
import pytest
from pydantic import BaseModel

from llm_router.api.openai_http import chunks, responses, translate
from llm_router.api.openai_http.errors import OpenAIError
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

USAGE = common_pb2.Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7)
MESSAGES: Any = [{"role": "user", "content": "solve 8x + 7 = -23"}]


class Step(BaseModel):
    explanation: str
    output: str


class MathReasoning(BaseModel):
    steps: list[Step]
    final_answer: str


class Unit(StrEnum):
    C = "celsius"
    F = "fahrenheit"


class Location(BaseModel):
    city: str
    country: str | None


class GetWeather(BaseModel):
    location: Location
    unit: Unit


ANSWER = MathReasoning(
    steps=[Step(explanation="subtract 7", output="8x = -30"), Step(explanation="/8", output="x")],
    final_answer="x = -3.75",
)
ARGUMENTS = GetWeather(location=Location(city="Paris", country=None), unit=Unit.C)

Unary = Callable[[pb.ChatRequest], pb.ChatResponse]
Streamed = Callable[[pb.ChatStreamRequest], list[pb.ChatStreamResponse]]


@dataclass
class FakeListener:
    """The layer with a scripted model behind it; records what the SDK sent."""

    unary: Unary | None = None
    streamed: Streamed | None = None
    bodies: list[dict[str, Any]] = field(default_factory=list)
    requests: list[Any] = field(default_factory=list)

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        try:
            call = translate.chat_call(body)
        except OpenAIError as err:
            return httpx2.Response(err.status, json=err.body())
        if call.stream:
            return self._stream(pb.ChatStreamRequest(**call.fields), call.include_usage)
        message = pb.ChatRequest(**call.fields)
        self.requests.append(message)
        assert self.unary is not None
        return httpx2.Response(200, json=responses.chat_completion(self.unary(message)))

    def _stream(self, message: pb.ChatStreamRequest, include_usage: bool) -> httpx2.Response:
        self.requests.append(message)
        assert self.streamed is not None
        replies = self.streamed(message)
        maker = chunks.ChunkMaker(chat=True)
        data = maker.first(replies[0]) + b"".join(maker.piece(m) for m in replies)
        if include_usage:
            data += maker.usage_chunk()
        headers = {"content-type": "text/event-stream"}
        return httpx2.Response(200, content=data + responses.DONE, headers=headers)


@pytest.fixture
def fake() -> FakeListener:
    return FakeListener()


@pytest.fixture
def client(fake: FakeListener) -> Iterator[openai.OpenAI]:
    http = openai.DefaultHttpxClient(transport=httpx2.MockTransport(fake))
    api = openai.OpenAI(api_key="k", base_url="http://listener/v1", http_client=http, max_retries=0)
    yield api
    api.close()


def text_reply(
    text: str, finish: common_pb2.FinishReason.ValueType = common_pb2.FINISH_REASON_STOP
) -> pb.ChatResponse:
    return pb.ChatResponse(
        request_id="r1",
        model="demo-llama",
        message=common_pb2.ChatMessage(role=common_pb2.ROLE_ASSISTANT, content=text),
        finish_reason=finish,
        usage=USAGE,
    )


def test_parse_with_a_nested_model(client: openai.OpenAI, fake: FakeListener) -> None:
    fake.unary = lambda _: text_reply(ANSWER.model_dump_json())
    completion = client.chat.completions.parse(
        model="demo", messages=MESSAGES, response_format=MathReasoning
    )
    assert completion.choices[0].message.parsed == ANSWER
    beta = client.beta.chat.completions.parse(
        model="demo", messages=MESSAGES, response_format=MathReasoning
    )
    assert beta.choices[0].message.parsed == ANSWER


def test_the_sdks_strict_schema_reaches_the_model_unchanged(
    client: openai.OpenAI, fake: FakeListener
) -> None:
    fake.unary = lambda _: text_reply(ANSWER.model_dump_json())
    client.chat.completions.parse(model="demo", messages=MESSAGES, response_format=MathReasoning)
    sent = fake.bodies[-1]["response_format"]
    assert sent["type"] == "json_schema"
    assert (sent["json_schema"]["name"], sent["json_schema"]["strict"]) == ("MathReasoning", True)
    schema = sent["json_schema"]["schema"]
    # What makes it the SDK's strict form: closed objects, every field required, $defs/$ref.
    assert schema["additionalProperties"] is False
    assert schema["required"] == ["steps", "final_answer"]
    assert schema["properties"]["steps"]["items"] == {"$ref": "#/$defs/Step"}
    assert schema["$defs"]["Step"]["additionalProperties"] is False
    assert json.loads(fake.requests[-1].sampling.format.json_schema) == schema


def test_a_truncated_answer_is_the_sdks_length_error(
    client: openai.OpenAI, fake: FakeListener
) -> None:
    fake.unary = lambda _: text_reply('{"steps": [', common_pb2.FINISH_REASON_LENGTH)
    with pytest.raises(openai.LengthFinishReasonError):
        client.chat.completions.parse(
            model="demo", messages=MESSAGES, response_format=MathReasoning
        )


def weather_call(call_id: str = "call_1") -> common_pb2.ToolCall:
    function = common_pb2.FunctionCall(name="GetWeather", arguments=ARGUMENTS.model_dump_json())
    return common_pb2.ToolCall(id=call_id, type="function", function=function)


def test_parse_tool_calls_into_the_model(client: openai.OpenAI, fake: FakeListener) -> None:
    fake.unary = lambda _: pb.ChatResponse(
        request_id="r2",
        model="demo-llama",
        message=common_pb2.ChatMessage(role=common_pb2.ROLE_ASSISTANT, tool_calls=[weather_call()]),
        finish_reason=common_pb2.FINISH_REASON_TOOL_CALLS,
        usage=USAGE,
    )
    tool = openai.pydantic_function_tool(GetWeather)
    completion = client.chat.completions.parse(
        model="demo", messages=MESSAGES, tools=[tool], tool_choice="required"
    )
    choice = completion.choices[0]
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", None)
    (call,) = choice.message.tool_calls or []
    assert call.id == "call_1"
    assert call.function.parsed_arguments == ARGUMENTS
    sent = fake.requests[-1]
    assert sent.tool_choice.mode == common_pb2.TOOL_CHOICE_MODE_REQUIRED
    assert sent.tools[0].function.strict
    assert json.loads(sent.tools[0].function.parameters_json) == tool["function"]["parameters"]


def tool_call_stream(_: pb.ChatStreamRequest) -> list[pb.ChatStreamResponse]:
    arguments = ARGUMENTS.model_dump_json()
    cut = len(arguments) // 2
    delta = common_pb2.ToolCallDelta
    return [
        pb.ChatStreamResponse(request_id="r3", model="demo-llama", delta="Let me check. "),
        pb.ChatStreamResponse(tool_calls=[delta(index=0, id="call_1", name="GetWeather")]),
        pb.ChatStreamResponse(tool_calls=[delta(index=0, arguments=arguments[:cut])]),
        pb.ChatStreamResponse(
            tool_calls=[
                delta(index=0, arguments=arguments[cut:]),
                delta(index=1, id="call_2", name="GetWeather", arguments=arguments),
            ]
        ),
        pb.ChatStreamResponse(finish_reason=common_pb2.FINISH_REASON_TOOL_CALLS, usage=USAGE),
    ]


def test_the_sdks_stream_helper_reassembles_tool_calls(
    client: openai.OpenAI, fake: FakeListener
) -> None:
    fake.streamed = tool_call_stream
    with client.chat.completions.stream(
        model="demo",
        messages=MESSAGES,
        tools=[openai.pydantic_function_tool(GetWeather)],
        stream_options={"include_usage": True},
    ) as stream:
        done = [e for e in stream if e.type == "tool_calls.function.arguments.done"]
        final = stream.get_final_completion()
    assert [e.parsed_arguments for e in done] == [ARGUMENTS, ARGUMENTS]
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check. "
    calls = choice.message.tool_calls or []
    assert [c.id for c in calls] == ["call_1", "call_2"]
    assert all(c.function.parsed_arguments == ARGUMENTS for c in calls)
    assert final.usage is not None
    assert final.usage.total_tokens == 7


def test_the_sdks_stream_helper_parses_streamed_json(
    client: openai.OpenAI, fake: FakeListener
) -> None:
    text = ANSWER.model_dump_json()
    fake.streamed = lambda _: [
        pb.ChatStreamResponse(request_id="r4", model="demo-llama", delta=text[:10]),
        pb.ChatStreamResponse(delta=text[10:]),
        pb.ChatStreamResponse(finish_reason=common_pb2.FINISH_REASON_STOP, usage=USAGE),
    ]
    with client.chat.completions.stream(
        model="demo", messages=MESSAGES, response_format=MathReasoning
    ) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.parsed == ANSWER
    assert fake.requests[-1].sampling.format.json_schema


def test_n_choices_logprobs_and_bias_through_the_sdk(
    client: openai.OpenAI, fake: FakeListener
) -> None:
    def two(request: pb.ChatRequest) -> pb.ChatResponse:
        reply = text_reply("a")
        for i, word in enumerate(("a", "b")):
            lp = common_pb2.TokenLogprob(
                token=word,
                logprob=-0.5,
                top_logprobs=[common_pb2.TopLogprob(token=word, logprob=-0.5)],
            )
            reply.choices.add(
                index=i,
                message=common_pb2.ChatMessage(content=word),
                finish_reason=common_pb2.FINISH_REASON_STOP,
                logprobs=[lp],
            )
        return reply

    fake.unary = two
    completion = client.chat.completions.create(
        model="demo",
        messages=MESSAGES,
        n=2,
        logprobs=True,
        top_logprobs=1,
        logit_bias={"42": -100},
        presence_penalty=0.5,
    )
    assert [c.message.content for c in completion.choices] == ["a", "b"]
    logprobs = completion.choices[1].logprobs
    assert logprobs is not None
    assert logprobs.content is not None
    assert logprobs.content[0].top_logprobs[0].bytes == [ord("b")]
    sampling = fake.requests[-1].sampling
    assert (sampling.n, sampling.top_logprobs, dict(sampling.logit_bias)) == (2, 1, {42: -100})


def test_a_bad_value_is_the_sdks_bad_request_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model="demo", messages=MESSAGES, logit_bias={"x": 1})
    assert err.value.param == "logit_bias"
