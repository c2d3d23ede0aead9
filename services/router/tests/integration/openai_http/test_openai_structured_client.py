"""Structured outputs and tool calls through the real listener and a real gRPC LLMService:
the official client's parse and stream helpers, end to end."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import grpc
import openai
import pytest
import pytest_asyncio
from pydantic import BaseModel

from llm_common.server import ServiceSpec
from llm_router.api.openai_http import start_openai_http
from llm_testing import running_server
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc

from .conftest import SERVICE, Listener, ScriptedLLM

pytestmark = pytest.mark.integration

MESSAGES: Any = [{"role": "user", "content": "weather in Paris?"}]


class City(BaseModel):
    name: str
    country: str


class Forecast(BaseModel):
    city: City
    days: list[int]


FORECAST = Forecast(city=City(name="Paris", country="FR"), days=[18, 20])


class StructuredLLM(ScriptedLLM):
    """With tools: calls the first one with FORECAST's JSON; with a format: answers FORECAST."""

    def _answer(self, request: Any) -> tuple[str, list[common_pb2.ToolCall]]:
        if not request.tools:
            return FORECAST.model_dump_json(), []
        function = common_pb2.FunctionCall(
            name=request.tools[0].function.name, arguments=FORECAST.model_dump_json()
        )
        return "", [common_pb2.ToolCall(id="call_7", type="function", function=function)]

    async def Chat(self, request: pb.ChatRequest, context: Any) -> pb.ChatResponse:  # noqa: N802
        self._check(request, context)
        text, calls = self._answer(request)
        finish = common_pb2.FINISH_REASON_TOOL_CALLS if calls else common_pb2.FINISH_REASON_STOP
        return pb.ChatResponse(
            request_id="r-s",
            model="demo-llama",
            message=common_pb2.ChatMessage(
                role=common_pb2.ROLE_ASSISTANT, content=text, tool_calls=calls
            ),
            finish_reason=finish,
            usage=common_pb2.Usage(prompt_tokens=2, completion_tokens=9, total_tokens=11),
        )

    async def ChatStream(  # noqa: N802
        self, request: pb.ChatStreamRequest, context: Any
    ) -> AsyncIterator[pb.ChatStreamResponse]:
        self._check(request, context)
        text, calls = self._answer(request)
        yield pb.ChatStreamResponse(request_id="r-s", model="demo-llama", delta=text[:5])
        yield pb.ChatStreamResponse(delta=text[5:])
        for call in calls:
            args = call.function.arguments
            first = common_pb2.ToolCallDelta(id=call.id, name=call.function.name)
            yield pb.ChatStreamResponse(tool_calls=[first])
            for piece in (args[:7], args[7:]):
                yield pb.ChatStreamResponse(tool_calls=[common_pb2.ToolCallDelta(arguments=piece)])
        finish = common_pb2.FINISH_REASON_TOOL_CALLS if calls else common_pb2.FINISH_REASON_STOP
        yield pb.ChatStreamResponse(
            finish_reason=finish, usage=common_pb2.Usage(completion_tokens=9, total_tokens=11)
        )


@pytest_asyncio.fixture
async def structured() -> AsyncIterator[Listener]:
    llm = StructuredLLM()

    def register(server: grpc.aio.Server) -> None:
        pb_grpc.add_LLMServiceServicer_to_server(llm, server)

    async with running_server(ServiceSpec((SERVICE,), register)) as upstream:
        http = await start_openai_http("127.0.0.1", 0, upstream.target)
        try:
            yield Listener(http, llm)
        finally:
            await http.close(grace_s=1.0)


@pytest_asyncio.fixture
async def api(structured: Listener) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(
        base_url=structured.base_url, api_key="unused-here", max_retries=0, timeout=10
    )
    yield client
    await client.close()


async def test_parse_a_nested_model(api: openai.AsyncOpenAI, structured: Listener) -> None:
    completion = await api.chat.completions.parse(
        model="demo", messages=MESSAGES, response_format=Forecast
    )
    assert completion.choices[0].message.parsed == FORECAST
    schema = json.loads(structured.llm.seen.requests[-1].sampling.format.json_schema)
    assert schema["properties"]["city"] == {"$ref": "#/$defs/City"}
    assert schema["additionalProperties"] is False


async def test_parse_a_tool_call(api: openai.AsyncOpenAI, structured: Listener) -> None:
    completion = await api.chat.completions.parse(
        model="demo",
        messages=MESSAGES,
        tools=[openai.pydantic_function_tool(Forecast, name="show_forecast")],
        tool_choice={"type": "function", "function": {"name": "show_forecast"}},
    )
    choice = completion.choices[0]
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", None)
    (call,) = choice.message.tool_calls or []
    assert (call.id, call.function.name) == ("call_7", "show_forecast")
    assert call.function.parsed_arguments == FORECAST
    assert structured.llm.seen.requests[-1].tool_choice.function_name == "show_forecast"


async def test_stream_a_tool_call(api: openai.AsyncOpenAI) -> None:
    async with api.chat.completions.stream(
        model="demo",
        messages=MESSAGES,
        tools=[openai.pydantic_function_tool(Forecast, name="show_forecast")],
    ) as stream:
        final = await stream.get_final_completion()
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.parsed_arguments == FORECAST


async def test_stream_parsed_json(api: openai.AsyncOpenAI) -> None:
    async with api.chat.completions.stream(
        model="demo", messages=MESSAGES, response_format=Forecast
    ) as stream:
        final = await stream.get_final_completion()
    assert final.choices[0].message.parsed == FORECAST
