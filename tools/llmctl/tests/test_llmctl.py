"""llmctl against a scripted LLMService on a free port: output, trace ids, and every failure
as one line with an exit status (never a traceback)."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc
import pytest
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc
from llmctl.cli import main
from llmctl.connection import Target, UsageError

WORDS = ["Hello", " from", " the", " stream"]


class Scripted(pb_grpc.LLMServiceServicer):
    """Streams WORDS; model `missing` is NOT_FOUND, `bad` INVALID_ARGUMENT with a field."""

    def __init__(self) -> None:
        self.metadata: list[dict[str, str]] = []

    def _fail(self, model: str, context: grpc.ServicerContext) -> None:
        if model == "missing":
            context.abort(grpc.StatusCode.NOT_FOUND, f"model {model!r} not found")
        if model == "bad":
            detail = error_details_pb2.BadRequest()
            detail.field_violations.add(
                field="sampling.temperature", description="must be in [0, 2]"
            )
            status = status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message="invalid request")
            status.details.add().Pack(detail)
            context.abort_with_status(rpc_status.to_status(status))

    def ChatStream(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:  # noqa: N802
        self.metadata.append({k: str(v) for k, v in context.invocation_metadata()})
        self._fail(request.model, context)
        for word in WORDS:
            yield pb.ChatStreamResponse(request_id="r-1", model="demo-llama", delta=word)
        usage = common_pb2.Usage(prompt_tokens=3, completion_tokens=4, total_tokens=7)
        yield pb.ChatStreamResponse(
            request_id="r-1",
            model="demo-llama",
            finish_reason=common_pb2.FINISH_REASON_STOP,
            usage=usage,
        )

    def ListModels(self, request: Any, context: grpc.ServicerContext) -> Any:  # noqa: N802
        info = pb.ModelInfo(
            name="demo-llama",
            aliases=["demo"],
            kind=common_pb2.MODEL_KIND_GENERATION,
            context_length=2048,
            tier="small",
        )
        return pb.ListModelsResponse(models=[info])


@pytest.fixture
def service() -> Iterator[tuple[str, Scripted]]:
    scripted = Scripted()  # type: ignore[abstract]  # only the methods llmctl calls here
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    pb_grpc.add_LLMServiceServicer_to_server(scripted, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", scripted
    server.stop(grace=None)


def run(
    addr: str, *args: str, key: str | None = "sk-test", stdin: str = ""
) -> tuple[int, str, str]:
    env = {"LLM_API_ADDR": addr}
    if key is not None:
        env["LLM_API_KEY"] = key
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), env, stdin=io.StringIO(stdin), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_chat_streams_then_prints_usage_and_the_trace_id(service: tuple[str, Scripted]) -> None:
    addr, scripted = service
    code, out, err = run(addr, "chat", "hi", "--max-tokens", "4")
    assert code == 0
    assert out == "".join(WORDS) + "\n"
    footer = r"\[usage: prompt=3 completion=4 cached=0 total=7 \| finish=stop \| request=r-1"
    match = re.fullmatch(footer + r" \| trace=([0-9a-f]{32})\]\n", err)
    assert match is not None, err
    sent = scripted.metadata[-1]
    assert sent["authorization"] == "Bearer sk-test"
    assert sent["traceparent"].split("-")[1] == match.group(1)  # the trace the platform records


def test_prompt_from_stdin(service: tuple[str, Scripted]) -> None:
    code, out, _ = run(service[0], "chat", stdin="from a pipe\n")
    assert code == 0
    assert out.startswith("Hello")


def test_models_table(service: tuple[str, Scripted]) -> None:
    code, out, _ = run(service[0], "models")
    assert code == 0
    assert out.splitlines()[1].split() == ["demo-llama", "generation", "2048", "small", "demo"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("chat", "hi", "--model", "missing"), "llmctl: NOT_FOUND: model 'missing' not found\n"),
        (
            ("chat", "hi", "--model", "bad"),
            "llmctl: INVALID_ARGUMENT: invalid request (sampling.temperature: must be in [0, 2])\n",
        ),
    ],
)
def test_call_failures_are_one_line(
    service: tuple[str, Scripted], args: tuple[str, ...], expected: str
) -> None:
    code, out, err = run(service[0], *args)
    assert (code, err) == (1, expected)
    assert out == ""


def test_unreachable_platform(unused_tcp_port: int) -> None:
    code, _, err = run(f"127.0.0.1:{unused_tcp_port}", "models")
    assert code == 1
    assert err.startswith("llmctl: UNAVAILABLE:")
    assert err.rstrip().endswith("(is the platform up? (`make status`))")
    assert err.count("\n") == 1


def test_missing_key_and_bad_address_are_usage_errors(service: tuple[str, Scripted]) -> None:
    code, _, err = run(service[0], "models", key=None)
    assert (code, err) == (2, "llmctl: set LLM_API_KEY to an API key (`make up` prints one)\n")
    code, _, err = run("nowhere", "models")
    assert code == 2
    assert err.startswith("llmctl: LLM_API_ADDR must be host:port")


def test_targets() -> None:
    assert Target.parse("https://gw.example:443") == Target("gw.example:443", True, None)
    assert Target.parse("http://127.0.0.1:8080/") == Target("127.0.0.1:8080", False, None)
    with pytest.raises(UsageError):
        Target.parse("no-port")
