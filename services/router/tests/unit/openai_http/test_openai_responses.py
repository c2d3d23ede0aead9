"""LLMService answers -> OpenAI objects and SSE chunks; gRPC errors -> OpenAI errors."""

from __future__ import annotations

import base64
import json
import struct

import grpc
import pytest

from llm_common.errors import (
    FieldViolation,
    InvalidArgument,
    NotFound,
    QuotaExceeded,
    QuotaViolation,
    ServiceError,
    Unavailable,
)
from llm_router.api.openai_http import chunks, responses
from llm_router.api.openai_http.errors import from_rpc_error, openai_param
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

USAGE = common_pb2.Usage(prompt_tokens=5, completion_tokens=3, cached_tokens=2, total_tokens=8)


def events(data: bytes) -> list[dict[str, object]]:
    assert data.startswith(b"data: ")
    assert data.endswith(b"\n\n")
    return [json.loads(data[len(b"data: ") : -2])]


def test_chat_completion_shape() -> None:
    reply = pb.ChatResponse(
        request_id="r1",
        model="demo-llama",
        message=common_pb2.ChatMessage(role=common_pb2.ROLE_ASSISTANT, content="hello"),
        finish_reason=common_pb2.FINISH_REASON_LENGTH,
        usage=USAGE,
    )
    reply.created.seconds = 1_700_000_000
    body = responses.chat_completion(reply)
    assert body["id"] == "chatcmpl-r1"
    assert body["created"] == 1_700_000_000
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hello", "refusal": None},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    assert body["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 3,
        "total_tokens": 8,
        "prompt_tokens_details": {"cached_tokens": 2},
    }


def test_text_completion_carries_logprobs_in_the_legacy_shape() -> None:
    reply = pb.CompleteResponse(
        request_id="r2",
        model="m",
        text="ab",
        finish_reason=common_pb2.FINISH_REASON_STOP,
        logprobs=[common_pb2.TokenLogprob(token_id=1, token="a", logprob=-0.5)],
    )
    choice = responses.text_completion(reply)["choices"][0]
    assert choice["text"] == "ab"
    assert choice["finish_reason"] == "stop"
    assert choice["logprobs"]["tokens"] == ["a"]
    assert choice["logprobs"]["token_logprobs"] == [-0.5]


def test_chat_chunks_open_with_the_role_and_end_with_finish_and_usage() -> None:
    maker = chunks.ChunkMaker(chat=True)
    first = pb.ChatStreamResponse(request_id="r3", model="m", delta="Hel")
    (opening,) = events(maker.first(first))
    assert opening["choices"] == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
    ]
    (content,) = events(maker.piece(first))
    assert content["id"] == "chatcmpl-r3"
    assert content["object"] == "chat.completion.chunk"
    last = pb.ChatStreamResponse(
        request_id="r3",
        model="m",
        delta="lo",
        finish_reason=common_pb2.FINISH_REASON_STOP,
        usage=USAGE,
    )
    (final,) = events(maker.piece(last))
    assert final["choices"][0]["delta"] == {"content": "lo"}  # type: ignore[index]
    assert final["choices"][0]["finish_reason"] == "stop"  # type: ignore[index]
    (usage,) = events(maker.usage_chunk())
    assert usage["choices"] == []
    assert usage["usage"]["total_tokens"] == 8  # type: ignore[index]


def test_empty_stream_messages_produce_no_chunk() -> None:
    maker = chunks.ChunkMaker(chat=False)
    message = pb.CompleteStreamResponse(request_id="r", model="m")
    assert maker.first(message) == b""  # completions have no role chunk
    assert maker.piece(message) == b""


def test_embeddings_as_floats_and_as_little_endian_base64() -> None:
    reply = pb.EmbedResponse(
        request_id="r",
        model="enc",
        embeddings=[
            pb.Embedding(index=1, values=[0.5, -1.0]),
            pb.Embedding(index=0, values=[0.25, 2.0]),
        ],
        usage=common_pb2.Usage(prompt_tokens=4, total_tokens=4),
    )
    floats = responses.embeddings(reply, as_base64=False)
    assert [d["index"] for d in floats["data"]] == [0, 1]
    assert floats["data"][0]["embedding"] == [0.25, 2.0]
    assert floats["usage"] == {"prompt_tokens": 4, "total_tokens": 4}
    packed = responses.embeddings(reply, as_base64=True)["data"][1]["embedding"]
    assert struct.unpack("<2f", base64.b64decode(packed)) == (0.5, -1.0)


def test_model_list_names_aliases_once() -> None:
    reply = pb.ListModelsResponse(
        models=[
            pb.ModelInfo(name="demo-llama", aliases=["demo", "default"]),
            pb.ModelInfo(name="enc", aliases=["demo"]),
        ]
    )
    ids = [m["id"] for m in responses.model_list(reply)["data"]]
    assert ids == ["demo-llama", "demo", "default", "enc"]


def rpc_error(error: ServiceError) -> grpc.aio.AioRpcError:
    """The error a client sees for `error` raised in a server behind ErrorInterceptor."""
    status = error.to_proto()
    trailing = grpc.aio.Metadata(("grpc-status-details-bin", status.SerializeToString()))
    return grpc.aio.AioRpcError(error.code, grpc.aio.Metadata(), trailing, details=error.message)


def test_not_found_model() -> None:
    err = from_rpc_error(rpc_error(NotFound("model", "gpt-9")))
    assert (err.status, err.type, err.code) == (404, "not_found_error", "model_not_found")


def test_invalid_argument_names_the_openai_parameter() -> None:
    violation = FieldViolation("sampling.max_tokens", "must be at most 2048")
    err = from_rpc_error(rpc_error(InvalidArgument([violation])))
    assert (err.status, err.param) == (400, "max_tokens")
    assert "max_tokens: must be at most 2048" in err.message


def test_quota_is_a_429_with_retry_after_and_budget_is_insufficient_quota() -> None:
    rate = from_rpc_error(
        rpc_error(QuotaExceeded([QuotaViolation("key:k", "tokens per minute")], 2.2))
    )
    assert (rate.status, rate.code, rate.headers) == (
        429,
        "rate_limit_exceeded",
        {"retry-after": "3"},
    )
    budget = from_rpc_error(
        rpc_error(QuotaExceeded([QuotaViolation("tenant:t", "monthly budget spent")]))
    )
    assert budget.code == "insufficient_quota"


def test_unavailable_is_a_503_server_error() -> None:
    err = from_rpc_error(rpc_error(Unavailable("no replica", retry_after_s=1)))
    assert (err.status, err.type, err.headers) == (503, "server_error", {"retry-after": "1"})


@pytest.mark.parametrize(
    ("path", "param"),
    [
        ("sampling.stop[2]", "stop[2]"),
        ("inputs[3]", "input[3]"),
        ("messages[0].content", "messages[0].content"),
        ("sampling.top_pp", "sampling.top_pp"),
    ],
)
def test_openai_param(path: str, param: str) -> None:
    assert openai_param(path) == param
