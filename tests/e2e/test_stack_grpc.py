"""Through the edge: gRPC (plaintext and TLS), REST by transcoding, auth, rate limits, admin."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

import grpc
import pytest
from google.protobuf import timestamp_pb2

from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.billing.v1 import billing_service_pb2_grpc as billing_grpc
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc

from .conftest import RunningStack

pytestmark = pytest.mark.e2e


def bearer(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


def chat_request(
    text: str = "Hello there", max_tokens: int = 8, **sampling: Any
) -> pb.ChatStreamRequest:
    params = common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0, **sampling)
    message = common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)
    return pb.ChatStreamRequest(model="demo", messages=[message], sampling=params)


def stream_chat(
    channel: grpc.Channel, key: str, request: pb.ChatStreamRequest
) -> list[pb.ChatStreamResponse]:
    return list(
        pb_grpc.LLMServiceStub(channel).ChatStream(request, metadata=bearer(key), timeout=60)
    )


def test_grpc_chat_stream_through_the_edge(stack: RunningStack) -> None:
    with grpc.insecure_channel(stack.edge) as channel:
        messages = stream_chat(channel, stack.demo_key, chat_request(max_tokens=6))
    final = messages[-1]
    assert final.finish_reason in (common_pb2.FINISH_REASON_LENGTH, common_pb2.FINISH_REASON_STOP)
    assert 0 < final.usage.completion_tokens <= 6
    assert "".join(m.delta for m in messages)
    assert final.usage.total_tokens == final.usage.prompt_tokens + final.usage.completion_tokens
    assert all(m.finish_reason == common_pb2.FINISH_REASON_UNSPECIFIED for m in messages[:-1])
    assert len({m.request_id for m in messages}) == 1


def test_grpc_over_tls_with_the_dev_certificate(stack: RunningStack) -> None:
    credentials = grpc.ssl_channel_credentials(stack.endpoints.ca_cert.read_bytes())
    with grpc.secure_channel(stack.endpoints.edge_tls, credentials) as channel:
        reply = pb_grpc.LLMServiceStub(channel).ListModels(
            pb.ListModelsRequest(), metadata=bearer(stack.demo_key), timeout=10
        )
    assert "demo-llama" in [m.name for m in reply.models]


def test_client_deadline_is_honoured(stack: RunningStack) -> None:
    """Envoy passes the client's grpc-timeout on and enforces it (a unary generation sends
    nothing before it ends, so every layer answers the same status)."""
    fields = {f.name: v for f, v in chat_request(max_tokens=1500, ignore_eos=True).ListFields()}
    started = time.monotonic()
    with grpc.insecure_channel(stack.edge) as channel, pytest.raises(grpc.RpcError) as err:
        pb_grpc.LLMServiceStub(channel).Chat(
            pb.ChatRequest(**fields), metadata=bearer(stack.demo_key), timeout=0.5
        )
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert time.monotonic() - started < 5


def test_streams_cut_by_their_deadline_blame_no_replica(stack: RunningStack) -> None:
    """A stream still running at the client's deadline ends DEADLINE_EXCEEDED, never with a
    reset (INTERNAL from Envoy's timers), and the cut is not counted against the replica:
    before, a few short deadlines excluded every replica and the next calls got UNAVAILABLE."""
    outcomes = []
    with grpc.insecure_channel(stack.edge) as channel:
        stub = pb_grpc.LLMServiceStub(channel)
        for i in range(12):
            request = chat_request(f"Tell a long story {i}", max_tokens=1500, ignore_eos=True)
            request.cache.bypass = True
            call = stub.ChatStream(request, metadata=bearer(stack.demo_key), timeout=0.4)
            received: list[pb.ChatStreamResponse] = []
            with pytest.raises(grpc.RpcError) as err:
                received.extend(call)  # keeps what arrived before the error
            outcomes.append((err.value.code(), len(received)))
        assert {code for code, _ in outcomes} == {grpc.StatusCode.DEADLINE_EXCEEDED}, outcomes
        assert any(received for _, received in outcomes)  # some were cut mid-answer
        final = stream_chat(channel, stack.demo_key, chat_request(max_tokens=4))[-1]
    assert final.finish_reason in (common_pb2.FINISH_REASON_LENGTH, common_pb2.FINISH_REASON_STOP)


def http(
    stack: RunningStack, path: str, body: dict[str, Any] | None, key: str | None
) -> tuple[int, dict[str, str], bytes]:
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{stack.edge}{path}", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read()


def test_rest_stream_through_transcoding_is_sse(stack: RunningStack) -> None:
    body = {
        "model": "demo",
        "messages": [{"role": "ROLE_USER", "content": "Hi"}],
        "sampling": {"max_tokens": 4, "temperature": 0},
    }
    status, headers, raw = http(stack, "/llmapi.llm.v1.LLMService/ChatStream", body, stack.demo_key)
    assert status == 200
    assert headers["content-type"] == "text/event-stream"
    events = [json.loads(e.removeprefix(b"data: ")) for e in raw.split(b"\n\n") if e.strip()]
    assert events[-1]["finish_reason"] in ("FINISH_REASON_LENGTH", "FINISH_REASON_STOP")
    assert events[-1]["usage"]["completion_tokens"] <= 4


def test_rest_errors_carry_status_and_details(stack: RunningStack) -> None:
    body = {"model": "no-such-model", "messages": [{"role": "ROLE_USER", "content": "Hi"}]}
    status, _, raw = http(stack, "/llmapi.llm.v1.LLMService/Chat", body, stack.demo_key)
    assert status == 404
    error = json.loads(raw)
    assert error["code"] == grpc.StatusCode.NOT_FOUND.value[0]
    assert error["details"][0]["resource_name"] == "no-such-model"


@pytest.mark.parametrize(
    ("metadata", "code"),
    [
        ((), grpc.StatusCode.UNAUTHENTICATED),
        (
            (
                (
                    "authorization",
                    "Bearer sk-0000000000000000.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA",
                ),
            ),
            grpc.StatusCode.UNAUTHENTICATED,
        ),
        ((("authorization", "Basic dXNlcjpwYXNz"),), grpc.StatusCode.UNAUTHENTICATED),
    ],
)
def test_auth_failures(
    stack: RunningStack, metadata: tuple[tuple[str, str], ...], code: grpc.StatusCode
) -> None:
    with grpc.insecure_channel(stack.edge) as channel, pytest.raises(grpc.RpcError) as err:
        list(
            pb_grpc.LLMServiceStub(channel).ChatStream(
                chat_request(), metadata=metadata, timeout=10
            )
        )
    assert err.value.code() == code


def test_a_key_without_the_completion_scope_is_denied(stack: RunningStack) -> None:
    key = stack.create_key(scopes=("embedding:read",), name="no completion")
    with grpc.insecure_channel(stack.edge) as channel, pytest.raises(grpc.RpcError) as err:
        stream_chat(channel, key, chat_request())
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_a_revoked_key_stops_working(stack: RunningStack) -> None:
    from llmapi.auth.v1 import auth_service_pb2 as auth_pb
    from llmapi.auth.v1 import auth_service_pb2_grpc as auth_grpc

    key = stack.create_key(name="to revoke")
    key_id = key.removeprefix("sk-").split(".")[0]
    with grpc.insecure_channel(stack.edge) as channel:
        llm = pb_grpc.LLMServiceStub(channel)
        llm.ListModels(pb.ListModelsRequest(), metadata=bearer(key), timeout=10)
        auth_grpc.AuthServiceStub(channel).RevokeKey(
            auth_pb.RevokeKeyRequest(key_id=key_id),
            metadata=(("x-api-key", stack.admin_key),),
            timeout=10,
        )
        with pytest.raises(grpc.RpcError) as err:
            llm.ListModels(pb.ListModelsRequest(), metadata=bearer(key), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_rate_limit_is_resource_exhausted_for_grpc_and_429_for_http(stack: RunningStack) -> None:
    key = stack.create_key(requests_per_minute=3, name="limited")
    # A client claiming to be unlimited is not believed: only ext_authz may say so.
    metadata = (*bearer(key), ("x-no-rate-limit", "key,tenant"))
    with grpc.insecure_channel(stack.edge) as channel:
        llm = pb_grpc.LLMServiceStub(channel)
        for _ in range(3):
            llm.ListModels(pb.ListModelsRequest(), metadata=metadata, timeout=10)
        with pytest.raises(grpc.RpcError) as err:
            llm.ListModels(pb.ListModelsRequest(), metadata=metadata, timeout=10)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    status, headers, raw = http(
        stack, "/v1/chat/completions", {"model": "demo", "messages": []}, key
    )
    assert status == 429
    assert json.loads(raw)["error"]["code"] == "rate_limit_exceeded"
    assert "x-ratelimit-limit" in {k.lower() for k in headers}


def rate_limit_answers(stack: RunningStack) -> int:
    """How many answers the edge's rate-limit filter has had from auth, over every route."""
    url = f"http://{stack.endpoints.admin}/stats?filter=ratelimit"
    with urllib.request.urlopen(url, timeout=5) as response:
        lines = response.read().decode().splitlines()
    kinds = (".ratelimit.ok", ".ratelimit.over_limit", ".ratelimit.error")
    return sum(
        int(value)
        for name, _, value in (line.partition(": ") for line in lines)
        if name.endswith(kinds)
    )


def test_a_key_without_request_limits_costs_no_rate_limit_call(stack: RunningStack) -> None:
    limited = stack.create_key(requests_per_minute=1000, name="limited-high")
    with grpc.insecure_channel(stack.edge) as channel:
        llm = pb_grpc.LLMServiceStub(channel)
        before = rate_limit_answers(stack)
        for _ in range(3):  # the demo key, its tenant: no request limit (make up's defaults)
            llm.ListModels(pb.ListModelsRequest(), metadata=bearer(stack.demo_key), timeout=10)
        after_unlimited = rate_limit_answers(stack)
        for _ in range(2):
            llm.ListModels(pb.ListModelsRequest(), metadata=bearer(limited), timeout=10)
        after_limited = rate_limit_answers(stack)
    assert after_unlimited == before
    assert after_limited == before + 2


def _usage(stack: RunningStack, tenant: str, key: str) -> billing_pb.GetUsageResponse:
    now = int(time.time())
    request = billing_pb.GetUsageRequest(
        tenant_id=tenant,
        start_time=timestamp_pb2.Timestamp(seconds=now - 3600),
        end_time=timestamp_pb2.Timestamp(seconds=now + 3600),
        granularity=billing_pb.GRANULARITY_TOTAL,
    )
    with grpc.insecure_channel(stack.edge) as channel:
        reply: billing_pb.GetUsageResponse = billing_grpc.BillingServiceStub(channel).GetUsage(
            request, metadata=bearer(key), timeout=10
        )
    return reply


def test_spoofed_identity_headers_are_replaced_and_usage_is_billed(stack: RunningStack) -> None:
    key = stack.create_key(tenant="e2e-billed", name="billed")
    spoofed = (*bearer(key), ("x-tenant-id", "e2e-victim"), ("x-key-id", "someone-else"))
    request = pb.ChatRequest(**{f.name: v for f, v in chat_request(max_tokens=3).ListFields()})
    with grpc.insecure_channel(stack.edge) as channel:
        pb_grpc.LLMServiceStub(channel).Chat(request, metadata=spoofed, timeout=60)
    deadline = time.monotonic() + 15  # settlement runs after the answer
    while _usage(stack, "e2e-billed", stack.admin_key).total.requests < 1:
        assert time.monotonic() < deadline, "the request was never billed"
        time.sleep(0.2)
    assert _usage(stack, "e2e-victim", stack.admin_key).total.requests == 0


def test_admin_routes_need_an_admin_of_the_admin_tenant(stack: RunningStack) -> None:
    tenant_admin = stack.create_key(tenant="e2e-other", scopes=("admin",), name="tenant admin")
    with pytest.raises(grpc.RpcError) as err:
        _usage(stack, "e2e-billed", tenant_admin)
    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as plain:
        _usage(stack, "e2e-billed", stack.demo_key)
    assert plain.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_unknown_paths_are_not_routed(stack: RunningStack) -> None:
    with grpc.insecure_channel(stack.edge) as channel:
        settle: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            "/llmapi.billing.v1.BillingService/Settle"
        )
        with pytest.raises(grpc.RpcError) as err:
            settle(b"", metadata=bearer(stack.demo_key), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_invoices_are_reachable_through_the_edge_for_admins_only(stack: RunningStack) -> None:
    request = billing_pb.CreateInvoiceRequest(tenant_id="e2e-invoiced", month="2020-01")
    with grpc.insecure_channel(stack.edge) as channel:
        billing = billing_grpc.BillingServiceStub(channel)
        created = billing.CreateInvoice(request, metadata=bearer(stack.admin_key), timeout=30)
        again = billing.GetInvoice(
            billing_pb.GetInvoiceRequest(tenant_id="e2e-invoiced", month="2020-01"),
            metadata=bearer(stack.admin_key),
            timeout=10,
        )
        assert again.invoice == created.invoice
        with pytest.raises(grpc.RpcError) as plain:
            billing.GetInvoice(
                billing_pb.GetInvoiceRequest(tenant_id="e2e-invoiced", month="2020-01"),
                metadata=bearer(stack.demo_key),
                timeout=10,
            )
    assert plain.value.code() == grpc.StatusCode.PERMISSION_DENIED
