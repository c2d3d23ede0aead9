"""A caller no budget applies to skips billing's Reserve for a while; its usage is still
recorded exactly once, and a budget set meanwhile is enforced once the memo expires."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest

from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.billing.v1 import billing_service_pb2_grpc as billing_grpc
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

from .conftest import Stack, billed, deployment, router_settings, running_router, with_deployments

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
# Long enough that four short requests on a loaded 2-core CI machine stay inside the memo.
TTL_S = 2.0


def chat(i: int) -> pb.ChatRequest:
    message = common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=f"Question {i}?")
    params = common_pb2.SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    return pb.ChatRequest(model="demo", messages=[message], sampling=params)


async def test_unbudgeted_callers_skip_reserve_and_are_billed_exactly(
    stack: Stack, tmp_path: Path
) -> None:
    catalog = with_deployments(stack.catalog, deployment("demo-local", stack.replica_addrs))
    settings = router_settings(stack, tmp_path, billing_unbudgeted_ttl_s=TTL_S)
    caller = await stack.tenant()
    billing = billing_grpc.BillingServiceStub(stack.billing.channel)
    async with running_router(settings, catalog) as router:
        replies = [await router.stub.Chat(chat(i), metadata=caller.metadata) for i in range(4)]
        # The first request learnt that no budget applies; the next three did not reserve.
        assert router.metric("llm_router_budget_skipped_total") == 3
        usage = await billed(stack, caller.tenant, 4)
        assert usage.completion_tokens == sum(r.usage.completion_tokens for r in replies)
        assert usage.prompt_tokens == sum(r.usage.prompt_tokens for r in replies)
        # A budget set now: enforced as soon as the memo expires.
        budget = billing_pb.Budget(
            tenant_id=caller.tenant, period=billing_pb.BUDGET_PERIOD_DAY, hard_limit_micros=1
        )
        await billing.SetBudget(billing_pb.SetBudgetRequest(budget=budget))
        await asyncio.sleep(TTL_S + 0.1)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await router.stub.Chat(chat(9), metadata=caller.metadata)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert router.metric("llm_router_budget_skipped_total") == 3
    # Nothing more was billed, nothing held.
    assert (await billed(stack, caller.tenant, 4)).requests == 4
    status = await billing.GetBudget(billing_pb.GetBudgetRequest(tenant_id=caller.tenant))
    assert status.budget.reserved_micros == 0
