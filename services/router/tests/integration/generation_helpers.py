"""Helpers shared by the router's generation tests over the real stack (test_generation,
test_generation_policies): the router under test and small request builders."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from google.protobuf import timestamp_pb2

from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.billing.v1 import billing_service_pb2_grpc as billing_grpc
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

from .conftest import (
    Caller,
    Router,
    Stack,
    deployment,
    router_settings,
    running_router,
    wait_for,
    with_deployments,
)


@contextlib.asynccontextmanager
async def generation_router(stack: Stack, workdir: Path) -> AsyncIterator[Router]:
    """A router over both replicas of the stack, started once their load reports are in."""
    catalog = with_deployments(stack.catalog, deployment("demo-local", stack.replica_addrs))
    settings = router_settings(stack, workdir)
    async with running_router(settings, catalog) as running:
        # Load reports from both replicas before the first request.
        await wait_for(lambda: _fresh(running, stack))
        yield running


async def _fresh(router: Router, stack: Stack) -> bool:
    return all(router.runtime.board.health(r) == "fresh" for r in stack.replica_addrs)


def user(text: str) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)


def sampling(**kw: Any) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(**kw)


def bypass() -> pb.CachePolicy:
    return pb.CachePolicy(bypass=True)


async def usage_of(stack: Stack, tenant: str) -> billing_pb.UsageBucket:
    now = int(time.time())
    response = await billing_grpc.BillingServiceStub(stack.billing.channel).GetUsage(
        billing_pb.GetUsageRequest(
            tenant_id=tenant,
            start_time=timestamp_pb2.Timestamp(seconds=now - 7200),
            end_time=timestamp_pb2.Timestamp(seconds=now + 7200),
        )
    )
    return response.total


async def stream_text(
    router: Router, caller: Caller, request: pb.ChatStreamRequest
) -> tuple[str, list[pb.ChatStreamResponse]]:
    messages = [m async for m in router.stub.ChatStream(request, metadata=caller.metadata)]
    return "".join(m.delta for m in messages), messages
