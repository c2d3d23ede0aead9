"""Issue 32, 6a (the optional edge bucket) on a real Envoy: a caller refused by
`edge.local_rate_limit` learns why and when to retry, as it does from the rate-limit service:
gRPC gets RESOURCE_EXHAUSTED with a message and QuotaFailure + RetryInfo in
grpc-status-details-bin, HTTP gets `retry-after` and a body in its protocol's shape."""

from __future__ import annotations

import asyncio
import base64
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio
from google.rpc import code_pb2, error_details_pb2, status_pb2

from llm_envoy.local_bucket import refusal_message
from llm_envoy.policy_model import EdgePolicy, LocalRateLimit, MeshPolicy
from llm_envoy.testing import RunningEdge, running_edge
from llm_envoy.topology import LLM_SERVICE

from .conftest import PROTOS

pytestmark = [
    pytest.mark.integration,
    pytest.mark.security,
    pytest.mark.asyncio(loop_scope="module"),
]

# One token a minute: the first request spends it, every later one is refused.
BUCKET = LocalRateLimit(max_tokens=1, tokens_per_fill=1, fill_interval_s=60)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def edge(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningEdge]:
    policy = MeshPolicy(edge=EdgePolicy(local_rate_limit=BUCKET))
    workdir = tmp_path_factory.mktemp("bucket")
    # No auth: the bucket answers before ext_authz is asked.
    async with running_edge(workdir, PROTOS, auth=None, policy=policy) as envoy:
        await asyncio.to_thread(_http, envoy, "/v1/models", {})  # spends the token
        yield envoy


Answer = tuple[int, dict[str, str], bytes]


def _http(edge: RunningEdge, path: str, headers: dict[str, str]) -> Answer:
    request = urllib.request.Request(
        f"http://{edge.edge_http}{path}", data=b"{}", headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, dict(reply.headers), reply.read()
    except urllib.error.HTTPError as err:
        return err.code, {k.lower(): v for k, v in err.headers.items()}, err.read()


async def test_grpc_callers_get_a_message_and_retry_info(edge: RunningEdge) -> None:
    async with grpc.aio.insecure_channel(edge.edge_http) as channel:
        call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            f"/{LLM_SERVICE}/CountTokens"
        )
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(b"", timeout=10)
    err = caught.value
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.details() == refusal_message(BUCKET)
    trailers = dict(err.trailing_metadata() or ())
    assert trailers["retry-after"] == "60"
    raw = trailers["grpc-status-details-bin"]
    status = status_pb2.Status.FromString(raw if isinstance(raw, bytes) else base64.b64decode(raw))
    assert status.code == code_pb2.RESOURCE_EXHAUSTED
    retry, quota = error_details_pb2.RetryInfo(), error_details_pb2.QuotaFailure()
    assert any(d.Unpack(retry) for d in status.details)
    assert any(d.Unpack(quota) for d in status.details)
    assert retry.retry_delay.seconds == 60
    assert quota.violations[0].subject == "edge"


async def test_openai_clients_get_retry_after_and_the_openai_object(edge: RunningEdge) -> None:
    status, headers, body = await asyncio.to_thread(
        _http, edge, "/v1/chat/completions", {"content-type": "application/json"}
    )
    assert status == 429
    assert headers["retry-after"] == "60"
    assert json.loads(body)["error"]["code"] == "rate_limit_exceeded"


async def test_rest_clients_get_retry_after_and_a_json_status(edge: RunningEdge) -> None:
    status, headers, body = await asyncio.to_thread(
        _http, edge, f"/{LLM_SERVICE}/CountTokens", {"content-type": "application/json"}
    )
    assert status == 429
    assert headers["retry-after"] == "60"
    assert json.loads(body) == {
        "code": code_pb2.RESOURCE_EXHAUSTED,
        "message": refusal_message(BUCKET),
        "details": [],
    }
