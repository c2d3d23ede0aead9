"""Dependencies down: billing (admit per policy, settle through the durable outbox, replayed
when billing is back) and auth's token quota (fail open, counted)."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from google.protobuf import timestamp_pb2

from llm_auth.testing import delete_prefix, unique_prefix
from llm_common.errors import parse_error
from llm_router.safety.policies import parse_policies
from llm_testing import LogCapture, free_port
from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.billing.v1 import billing_service_pb2_grpc as billing_grpc
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

from .conftest import (
    Stack,
    deployment,
    router_settings,
    running_billing,
    running_router,
    wait_for,
    with_deployments,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


def chat(max_tokens: int = 3) -> pb.ChatRequest:
    return pb.ChatRequest(
        model="demo",
        messages=[common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content="hello")],
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        cache=pb.CachePolicy(bypass=True),
    )


async def test_billing_down_admits_and_replays_from_the_outbox(
    stack: Stack, redis_url: str, tmp_path: Path, json_logs: LogCapture
) -> None:
    port = free_port()  # billing will come up here later
    caller = await stack.tenant()
    strict = await stack.tenant()
    policies = parse_policies(
        {"tenants": {strict.tenant: {"admission": {"billing_unavailable": "reject"}}}}
    )
    catalog = with_deployments(stack.catalog, deployment("d", stack.replica_addrs))
    settings = router_settings(
        stack, tmp_path, billing_addr=f"127.0.0.1:{port}", breaker_reset_s=0.2, call_timeout_s=1.0
    )
    prefix = unique_prefix()
    async with running_router(settings, catalog, policies) as router:
        replies = [await router.stub.Chat(chat(), metadata=caller.metadata) for _ in range(3)]
        assert [r.usage.completion_tokens for r in replies] == [3, 3, 3]
        assert (
            router.metric(
                "llm_router_degraded_total", dependency="billing", action="admitted_unreserved"
            )
            == 3
        )
        # One warning per outage period, not one per request (the metric counts each).
        warned = json_logs.events("billing unavailable: admitted, usage goes to the outbox")
        assert [line["left_out"] for line in warned] == [0]

        # A tenant whose policy rejects unmetered traffic gets UNAVAILABLE instead.
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await router.stub.Chat(chat(), metadata=strict.metadata)
        details = parse_error(info.value)
        assert details.code == grpc.StatusCode.UNAVAILABLE
        assert details.retry_after_s is not None

        outbox = router.runtime.spool.outbox

        async def spooled() -> bool:
            return await outbox.pending() == 3

        await wait_for(spooled)
        try:
            async with running_billing(redis_url, prefix, tmp_path, port=port) as billing:

                async def replayed() -> billing_pb.UsageBucket | None:
                    total = await _usage(billing.channel, caller.tenant)
                    return total if total is not None and total.requests == 3 else None

                total = await wait_for(replayed, timeout_s=30.0)
                assert total.prompt_tokens == sum(r.usage.prompt_tokens for r in replies)
                assert total.completion_tokens == 9
                assert await outbox.pending() == 0
        finally:
            await delete_prefix(redis_url, prefix)


async def _usage(channel: grpc.aio.Channel, tenant: str) -> billing_pb.UsageBucket | None:
    now = int(time.time())
    request = billing_pb.GetUsageRequest(
        tenant_id=tenant,
        start_time=timestamp_pb2.Timestamp(seconds=now - 7200),
        end_time=timestamp_pb2.Timestamp(seconds=now + 7200),
    )
    try:
        response = await billing_grpc.BillingServiceStub(channel).GetUsage(request)
    except grpc.aio.AioRpcError as err:
        # Channels to this address share a subchannel still in its reconnect backoff.
        if err.code() == grpc.StatusCode.UNAVAILABLE:
            return None
        raise
    return response.total if response.total.requests else None


async def test_quota_check_fails_open_when_auth_is_down(stack: Stack, tmp_path: Path) -> None:
    catalog = with_deployments(stack.catalog, deployment("d", stack.replica_addrs))
    settings = router_settings(stack, tmp_path)
    dead_auth = f"127.0.0.1:{free_port()}"
    settings = settings.__class__(
        server=settings.server,
        downstream=settings.downstream.__class__(
            tokenizer_addr=settings.downstream.tokenizer_addr,
            billing_addr=settings.downstream.billing_addr,
            auth_addr=dead_auth,
            call_timeout_s=1.0,
        ),
        outbox_dir=settings.outbox_dir,
        routing=settings.routing,
    )
    caller = await stack.tenant(tokens_per_minute=10)  # would refuse any request if checked
    async with running_router(settings, catalog) as router:
        reply = await router.stub.Chat(chat(), metadata=caller.metadata)
        assert reply.usage.completion_tokens == 3
        assert (
            router.metric(
                "llm_router_degraded_total", dependency="auth", action="admitted_unchecked"
            )
            == 1
        )
