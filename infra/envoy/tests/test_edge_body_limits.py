"""Issue 32, findings 2 and 3, on a real Envoy with the rendered edge and a real auth: a body
over the edge's limit is refused with 413 in each protocol's shape (OpenAI's error object on
/v1, RESOURCE_EXHAUSTED for gRPC, the transcoder's JSON status for REST) before the router is
called, whether it announces its length or streams it chunked. The 50 MB x 8 heap figure is
`make bench-security`'s (bench/bench_security.py)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio

from llm_envoy.body_limits import too_large_message
from llm_envoy.policy_model import Limits
from llm_envoy.testing import post_body
from llm_envoy.topology import LLM_SERVICE

from .edge_auth import Edge, edge_with_auth

pytestmark = [
    pytest.mark.integration,
    pytest.mark.security,
    pytest.mark.asyncio(loop_scope="module"),
]

LIMIT = Limits().max_request_body_bytes or 0
OVER = LIMIT + 512 * 1024  # a little over: the test stays cheap
CHAT = f"/{LLM_SERVICE}/Chat"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def edge(redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Edge]:
    async with edge_with_auth(redis_url, tmp_path_factory.mktemp("edge")) as running:
        yield running


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_oversized_openai_body_gets_413_in_openai_shape(edge: Edge, chunked: bool) -> None:
    seen_before = len(edge.envoy.recorder.http_requests)
    answer = await asyncio.to_thread(
        post_body,
        edge.envoy.edge_http,
        "/v1/chat/completions",
        {"authorization": f"Bearer {edge.key}", "content-type": "application/json"},
        OVER,
        chunked=chunked,
    )
    assert answer.status == 413, answer
    error = json.loads(answer.body)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "request_too_large"
    assert error["message"] == too_large_message(LIMIT)
    assert len(edge.envoy.recorder.http_requests) == seen_before  # the router never saw it


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_oversized_rest_body_gets_413_not_a_retryable_429(edge: Edge, chunked: bool) -> None:
    answer = await asyncio.to_thread(
        post_body,
        edge.envoy.edge_http,
        CHAT,
        {"authorization": f"Bearer {edge.key}", "content-type": "application/json"},
        OVER,
        chunked=chunked,
    )
    assert answer.status == 413, answer
    assert json.loads(answer.body) == {
        "code": 8,
        "message": too_large_message(LIMIT),
        "details": [],
    }
    assert CHAT not in edge.envoy.recorder.grpc_calls


async def test_oversized_grpc_message_is_resource_exhausted(edge: Edge) -> None:
    async with grpc.aio.insecure_channel(edge.envoy.edge_http) as channel:
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(CHAT)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(b"\x0a" * OVER, metadata=[("x-api-key", edge.key)], timeout=10)
        assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert caught.value.details() == too_large_message(LIMIT)
        # Within the limit the call goes through (the stand-in router answers it).
        await call(b"", metadata=[("x-api-key", edge.key)], timeout=10)
    assert edge.envoy.recorder.grpc_calls.count(CHAT) == 1


async def test_oversized_body_is_refused_before_auth_is_asked(edge: Edge) -> None:
    answer = await asyncio.to_thread(
        post_body, edge.envoy.edge_http, "/v1/chat/completions", {}, OVER, chunked=True
    )
    assert answer.status == 413  # not 401: the body limit comes first, whoever sends it


async def test_limit_is_the_routers() -> None:
    # The router refuses bodies over 4 MiB itself; the edge must refuse first (finding 3).
    from llm_router.api.openai_http.wire import MAX_BODY_BYTES

    assert LIMIT == MAX_BODY_BYTES
