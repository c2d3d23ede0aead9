"""Replica failures against real replicas: failover before the first token, exclusion, a
replica lost mid-stream, and UNAVAILABLE with RetryInfo when no replica is left."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from llm_common.errors import parse_error
from llm_router.routing.settings import RoutingSettings
from llm_testing import bytes_service, free_port, running_server
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

from .conftest import (
    MODEL,
    Stack,
    deployment,
    router_settings,
    running_inference,
    running_router,
    wait_for,
    with_deployments,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
# Fast retries and long exclusions keep the tests short and their outcome certain.
ROUTING = RoutingSettings(
    load_interval_ms=50, load_stale_s=2.0, retry_base_s=0.01, retry_jitter_s=0.01, exclude_s=30.0,
    exclude_max_s=60.0,
)  # fmt: skip


def chat(max_tokens: int = 4) -> pb.ChatRequest:
    return pb.ChatRequest(
        model="demo",
        messages=[common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content="hello")],
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        cache=pb.CachePolicy(bypass=True),
    )


async def test_failover_before_the_first_token(stack: Stack, tmp_path: Path) -> None:
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there: UNAVAILABLE at once
    # The dead replica's deployment is tried first; the live one only takes over.
    catalog = with_deployments(
        stack.catalog,
        deployment("primary", [dead], weight=100),
        deployment("fallback", stack.replica_addrs[:1], weight=0),
    )
    caller = await stack.tenant()
    async with running_router(router_settings(stack, tmp_path, routing=ROUTING), catalog) as router:
        reply = await router.stub.Chat(chat(), metadata=caller.metadata)
        assert reply.usage.completion_tokens == 4
        assert (
            router.metric(
                "llm_router_failovers_total", model=MODEL, replica=dead, code="UNAVAILABLE"
            )
            == 1
        )
        assert router.runtime.board.health(dead) == "excluded"
        # The excluded replica is not tried again.
        await router.stub.Chat(chat(), metadata=caller.metadata)
        assert (
            router.metric(
                "llm_router_failovers_total", model=MODEL, replica=dead, code="UNAVAILABLE"
            )
            == 1
        )
        served = (
            router.metric(
                "llm_router_routing_decisions_total",
                model=MODEL,
                replica=stack.replica_addrs[0],
                reason="unknown_load",
            )
            + router.metric(
                "llm_router_routing_decisions_total",
                model=MODEL,
                replica=stack.replica_addrs[0],
                reason="load",
            )
            + router.metric(
                "llm_router_routing_decisions_total",
                model=MODEL,
                replica=stack.replica_addrs[0],
                reason="affinity",
            )
        )
        assert served == 2


async def test_no_replica_left_is_unavailable_with_retry_info(stack: Stack, tmp_path: Path) -> None:
    dead = [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]
    catalog = with_deployments(stack.catalog, deployment("gone", dead))
    caller = await stack.tenant()
    async with running_router(router_settings(stack, tmp_path, routing=ROUTING), catalog) as router:
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await router.stub.Chat(chat(), metadata=caller.metadata)
        details = parse_error(info.value)
        assert details.code == grpc.StatusCode.UNAVAILABLE
        assert details.retry_after_s is not None
        assert 20.0 < details.retry_after_s <= 30.0  # until the first exclusion ends
        # A streamed request fails the same way, before any message.
        stream = router.stub.ChatStream(
            pb.ChatStreamRequest(model="demo", messages=chat().messages), metadata=caller.metadata
        )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            [m async for m in stream]
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert (
            await router.stub.ListModels(pb.ListModelsRequest(), metadata=caller.metadata)
        ).models


async def test_replica_lost_mid_stream_ends_with_error_and_bills_what_was_sent(
    stack: Stack, tmp_path: Path
) -> None:
    async with running_inference(stack.workdir / "models.yaml", "doomed") as doomed:
        catalog = with_deployments(stack.catalog, deployment("only", [doomed.target]))
        caller = await stack.tenant()
        settings = router_settings(stack, tmp_path, routing=ROUTING)
        async with running_router(settings, catalog) as router:
            request = pb.ChatStreamRequest(
                model="demo",
                messages=chat().messages,
                sampling=common_pb2.SamplingParams(max_tokens=900, ignore_eos=True),
                cache=pb.CachePolicy(bypass=True),
            )
            messages = []
            async for message in router.stub.ChatStream(request, metadata=caller.metadata):
                messages.append(message)
                if len(messages) == 3:
                    await doomed.server.stop(0)
            last = messages[-1]
            assert last.finish_reason == common_pb2.FINISH_REASON_ERROR
            assert 0 < last.usage.completion_tokens < 900
            assert router.runtime.board.health(doomed.target) == "excluded"

            # The next request finds no replica, and says when to come back.
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await router.stub.Chat(chat(), metadata=caller.metadata)
            assert info.value.code() == grpc.StatusCode.UNAVAILABLE

            async def settled() -> bool:
                return router.metric("llm_router_settlements_total", outcome="settled") >= 1

            await wait_for(settled)


async def _silent(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> Any:
    """A replica that accepts calls and never answers (a frozen process)."""
    await asyncio.Event().wait()
    yield b""  # pragma: no cover - never reached


async def test_a_silent_replica_is_left_after_the_first_token_timeout(
    stack: Stack, tmp_path: Path
) -> None:
    frozen = bytes_service(
        "llmapi.inference.v1.InferenceService",
        server_streaming={"Generate": _silent, "WatchLoad": _silent},
    )
    routing = dataclasses.replace(ROUTING, first_token_timeout_s=0.5)
    async with running_server(frozen) as silent:
        hung = f"127.0.0.1:{silent.port}"
        catalog = with_deployments(
            stack.catalog,
            deployment("primary", [hung], weight=100),
            deployment("fallback", stack.replica_addrs[:1], weight=0),
        )
        caller = await stack.tenant()
        settings = router_settings(stack, tmp_path, routing=routing)
        async with running_router(settings, catalog) as router:
            started = time.monotonic()
            reply = await router.stub.Chat(chat(), metadata=caller.metadata, timeout=30)
            assert reply.usage.completion_tokens == 4
            assert time.monotonic() - started < 10  # not the caller's 30 s deadline
            failovers = router.metric(
                "llm_router_failovers_total", model=MODEL, replica=hung, code="DEADLINE_EXCEEDED"
            )
            assert failovers == 1
            assert router.runtime.board.health(hung) == "excluded"
