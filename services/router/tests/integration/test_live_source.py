"""LiveSource against a real gRPC stream: the answer's last piece goes out as soon as the
replica's final message arrives, not when its stream ends; the stream is still read to its end,
so the replica sees a clean finish, not a cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from llm_common.models_config import Deployment
from llm_common.testing import bytes_service, running_server
from llm_router.background import Background
from llm_router.clients import GenerateCall
from llm_router.dispatch import Placed, Started
from llm_router.generation import LiveSource
from llm_router.load import Ticket
from llm_router.selection import Choice
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as inf_pb
from llmapi.inference.v1 import inference_service_pb2_grpc as inf_grpc

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
REPLICA = "replica:1"


class Releaser:
    def __init__(self) -> None:
        self.finished: list[Ticket] = []
        self.failed: list[str] = []

    def finish(self, ticket: Ticket) -> None:
        self.finished.append(ticket)

    def fail(self, replica: str) -> None:
        self.failed.append(replica)


class SlowToEnd:
    """A replica that sends its answer, then holds its stream's end until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.ended = asyncio.Event()

    async def generate(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        yield inf_pb.GenerateResponse(token_ids=[5], text_delta="a").SerializeToString()
        final = inf_pb.GenerateResponse(
            token_ids=[6], text_delta="b", finish_reason=common_pb2.FINISH_REASON_LENGTH
        )
        yield final.SerializeToString()
        await self.release.wait()  # a client cancellation would raise here instead
        self.ended.set()


async def test_the_last_piece_does_not_wait_for_the_stream_to_end() -> None:
    replica = SlowToEnd()
    spec = bytes_service(
        "llmapi.inference.v1.InferenceService", server_streaming={"Generate": replica.generate}
    )
    background, releaser = Background(), Releaser()
    async with running_server(spec) as server:
        stub = inf_grpc.InferenceServiceStub(server.channel)
        call = GenerateCall(REPLICA, stub.Generate(inf_pb.GenerateRequest(request_id="r1")))
        first = await call.next()
        assert first is not None
        ticket = Ticket(REPLICA, 1)
        choice = Choice(REPLICA, "load", 0, 1.0, 1.0)
        placed = Placed(Deployment("d", replicas=(REPLICA,)), choice, ticket, 1)
        source = LiveSource(Started(placed, call, first), releaser, background)

        async def relay() -> list[str]:
            return [piece.text async for piece in source.pieces()]

        # With the replica still holding its stream open, the whole answer is relayed.
        assert await asyncio.wait_for(relay(), timeout=5.0) == ["a", "b"]
        assert not replica.ended.is_set()
        source.close()
        assert releaser.finished == [ticket]
        assert releaser.failed == []
        # The stream's end is read in the background: the replica finishes, uncancelled.
        replica.release.set()
        await background.drain(5.0)
        assert replica.ended.is_set()
        assert len(background) == 0
