"""llmctl's --json-schema, --tool, --tool-choice, --n and --top-logprobs against a scripted
LLMService: what reaches the service, and what is printed."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc
from llmctl.cli import main

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER = {"name": "get_weather", "description": "Weather now", "parameters": SCHEMA}
CLOCK_TOOL = {"type": "function", "function": {"name": "now", "strict": True}}
ARGUMENTS = '{"city":"Paris"}'
USAGE = common_pb2.Usage(prompt_tokens=2, completion_tokens=3, total_tokens=5)


def _logprobs(request: Any, token: str) -> list[common_pb2.TokenLogprob]:
    if not request.sampling.logprobs:
        return []
    tops = [common_pb2.TopLogprob(token=token, logprob=-0.5)] * request.sampling.top_logprobs
    return [common_pb2.TokenLogprob(token=token, logprob=-0.5, top_logprobs=tops)]


class Structured(pb_grpc.LLMServiceServicer):
    """With tools: calls the first one with ARGUMENTS; else answers `{"city":"Paris"}` as text,
    once per sampling.n (answer i prefixed with i when n > 1)."""

    def __init__(self) -> None:
        self.requests: list[Any] = []

    @staticmethod
    def _text(request: Any, index: int) -> str:
        return ARGUMENTS if request.sampling.n <= 1 else f"{index}:{ARGUMENTS}"

    def ChatStream(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        self.requests.append(request)
        if request.tools:
            name = request.tools[0].function.name
            first = common_pb2.ToolCallDelta(index=0, id="call_1", name=name)
            yield pb.ChatStreamResponse(request_id="r", model="m", tool_calls=[first])
            for piece in (ARGUMENTS[:5], ARGUMENTS[5:]):
                delta = common_pb2.ToolCallDelta(index=0, arguments=piece)
                yield pb.ChatStreamResponse(tool_calls=[delta])
            finish = common_pb2.FINISH_REASON_TOOL_CALLS
            yield pb.ChatStreamResponse(finish_reason=finish, usage=USAGE)
            return
        yield from self._text_stream(request, pb.ChatStreamResponse)

    def CompleteStream(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        self.requests.append(request)
        yield from self._text_stream(request, pb.CompleteStreamResponse)

    def _text_stream(self, request: Any, kind: Any) -> Iterator[Any]:
        n = max(request.sampling.n, 1)
        for i in reversed(range(n)):  # interleaved, last choice first
            text = self._text(request, i)
            logprobs = _logprobs(request, text[:1])
            yield kind(request_id="r", model="m", index=i, delta=text[:4], logprobs=logprobs)
        for i in range(n):
            yield kind(index=i, delta=self._text(request, i)[4:])
        yield kind(finish_reason=common_pb2.FINISH_REASON_STOP, usage=USAGE)

    def Chat(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        self.requests.append(request)
        reply = pb.ChatResponse(request_id="r", model="m", usage=USAGE)
        if request.tools:
            function = common_pb2.FunctionCall(name="get_weather", arguments=ARGUMENTS)
            reply.message.tool_calls.add(id="call_9", type="function", function=function)
            reply.finish_reason = common_pb2.FINISH_REASON_TOOL_CALLS
            return reply
        reply.finish_reason = common_pb2.FINISH_REASON_STOP
        for i in range(request.sampling.n if request.sampling.n > 1 else 0):
            message = common_pb2.ChatMessage(content=self._text(request, i))
            reply.choices.add(index=i, message=message)
        reply.message.content = self._text(request, 0)
        return reply


@pytest.fixture
def service() -> Iterator[tuple[str, Structured]]:
    scripted = Structured()  # type: ignore[abstract]  # only the methods llmctl calls here
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_LLMServiceServicer_to_server(scripted, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", scripted
    server.stop(grace=None)


def run(addr: str, *args: str) -> tuple[int, str, str]:
    env = {"LLM_API_ADDR": addr, "LLM_API_KEY": "sk-test"}
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), env, stdin=io.StringIO(""), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def write(tmp_path: Path, name: str, value: Any) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(value, indent=2))
    return str(path)


@pytest.mark.parametrize(
    "wrapping",
    [
        lambda s: s,
        lambda s: {"name": "city", "schema": s, "strict": True},
        lambda s: {"type": "json_schema", "json_schema": {"name": "city", "schema": s}},
    ],
)
def test_json_schema_file(service: tuple[str, Structured], tmp_path: Path, wrapping: Any) -> None:
    addr, scripted = service
    schema = write(tmp_path, "schema.json", wrapping(SCHEMA))
    code, out, _ = run(addr, "chat", "where?", "--json-schema", schema)
    assert (code, out) == (0, ARGUMENTS + "\n")
    sent = scripted.requests[-1].sampling.format.json_schema
    assert json.loads(sent) == SCHEMA
    assert " " not in sent


def test_json_schema_for_completions(service: tuple[str, Structured], tmp_path: Path) -> None:
    addr, scripted = service
    schema = write(tmp_path, "schema.json", SCHEMA)
    code, out, _ = run(addr, "complete", "x", "--json-schema", schema)
    assert (code, out) == (0, ARGUMENTS + "\n")
    assert json.loads(scripted.requests[-1].sampling.format.json_schema) == SCHEMA


def test_streamed_tool_calls_are_reassembled(
    service: tuple[str, Structured], tmp_path: Path
) -> None:
    addr, scripted = service
    weather = write(tmp_path, "weather.json", WEATHER)
    clock = write(tmp_path, "clock.json", CLOCK_TOOL)
    code, out, err = run(
        addr, "chat", "weather?", "--tool", weather, "--tool", clock, "--tool-choice", "get_weather"
    )
    assert code == 0
    call = json.loads(out)
    assert call == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ARGUMENTS},
    }
    assert "finish=tool_calls" in err
    request = scripted.requests[-1]
    first, second = request.tools
    assert (first.function.name, first.function.description) == ("get_weather", "Weather now")
    assert json.loads(first.function.parameters_json) == SCHEMA
    assert (second.function.name, second.function.strict) == ("now", True)
    assert request.tool_choice.function_name == "get_weather"


def test_unary_tool_calls(service: tuple[str, Structured], tmp_path: Path) -> None:
    addr, scripted = service
    tools = write(tmp_path, "tools.json", [WEATHER, CLOCK_TOOL])
    args = ("--tool", tools, "--tool-choice", "required", "--no-stream")
    code, out, _ = run(addr, "chat", "x", *args)
    assert code == 0
    assert json.loads(out)["id"] == "call_9"
    assert len(scripted.requests[-1].tools) == 2
    assert scripted.requests[-1].tool_choice.mode == common_pb2.TOOL_CHOICE_MODE_REQUIRED


@pytest.mark.parametrize(
    ("files", "extra", "says"),
    [
        ({}, ("--tool-choice", "auto"), "--tool-choice needs at least one --tool"),
        ({"w.json": WEATHER}, ("--tool-choice", "other"), "none of the tools"),
        ({"w.json": {"description": "no name"}}, (), "a tool needs a name"),
        ({"w.json": {"name": "f", "parameters": "x"}}, (), "parameters must be"),
        ({"w.json": "{not json"}, (), "is not JSON"),
    ],
)
def test_bad_tool_arguments_are_usage_errors(
    service: tuple[str, Structured],
    tmp_path: Path,
    files: dict[str, Any],
    extra: tuple[str, ...],
    says: str,
) -> None:
    args = ["chat", "x", *extra]
    for name, value in files.items():
        path = tmp_path / name
        path.write_text(value if isinstance(value, str) else json.dumps(value))
        args += ["--tool", str(path)]
    code, out, err = run(service[0], *args)
    assert (code, out) == (2, "")
    assert says in err
    assert err.startswith("llmctl: ")
    assert err.count("\n") == 1


def test_a_missing_schema_file_is_a_usage_error(service: tuple[str, Structured]) -> None:
    code, _, err = run(service[0], "chat", "x", "--json-schema", "/nonexistent/schema.json")
    assert code == 2
    assert err.startswith("llmctl: cannot read /nonexistent/schema.json")


@pytest.mark.parametrize("stream", [True, False])
def test_n_answers_are_printed_whole_and_in_order(
    service: tuple[str, Structured], stream: bool
) -> None:
    addr, scripted = service
    args = ["chat", "x", "--n", "2", *([] if stream else ["--no-stream"])]
    code, out, _ = run(addr, *args)
    assert code == 0
    assert out == f"[choice 0]\n0:{ARGUMENTS}\n[choice 1]\n1:{ARGUMENTS}\n"
    assert scripted.requests[-1].sampling.n == 2


def test_top_logprobs_are_printed_on_stderr(service: tuple[str, Structured]) -> None:
    addr, scripted = service
    code, out, err = run(addr, "complete", "x", "--top-logprobs", "2")
    assert (code, out) == (0, ARGUMENTS + "\n")
    sampling = scripted.requests[-1].sampling
    assert (sampling.logprobs, sampling.top_logprobs) == (True, 2)
    assert err.splitlines()[:2] == ["[logprobs]", "'{' -0.5000  | '{' -0.5000, '{' -0.5000"]
