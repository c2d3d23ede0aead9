"""LiveSource against a real gRPC stream: the answer's last piece goes out as soon as the
replica's final message arrives, not when its stream ends; the stream is still read to its end,
so the replica sees a clean finish, not a cancellation."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Collection
from typing import Any

import grpc
import pytest

from llm_common.errors import Unavailable
from llm_common.models_config import Deployment
from llm_router.background import Background
from llm_router.clients.inference import InferenceClient, ReplicaChannels
from llm_router.generation.sources import LiveSource
from llm_router.routing.dispatch import Placed, Started, Target
from llm_router.routing.load import Ticket
from llm_router.routing.replica_stream import GenerateCall
from llm_router.routing.selection import Choice
from llm_testing import RunningServer, bytes_service, running_server
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

    async def resume(
        self, started: Started, resume: inf_pb.Resume, exclude: Collection[str]
    ) -> Started:
        raise Unavailable("no other replica here", retry_after_s=1.0)


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
        target = Target("m", (placed.deployment,), [1], common_pb2.SamplingParams(), stream=True)
        source = LiveSource(Started(placed, call, first, target), releaser, background)

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


class Stoppable:
    """A replica that streams a token every 10 ms until stopped, then sends the tokens it
    held back (as a replica grouping tokens would) and the exact count, like the real one."""

    def __init__(self, *, implements_stop: bool = True) -> None:
        self.implements_stop = implements_stop
        self.stopped = asyncio.Event()
        self.cancelled = asyncio.Event()

    async def generate(self, request: bytes, context: Any) -> AsyncIterator[bytes]:
        yield inf_pb.GenerateResponse(token_ids=[1], text_delta="a").SerializeToString()
        generated = 1
        try:
            while not self.stopped.is_set():
                await asyncio.sleep(0.01)
                generated += 1  # held, not sent
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        final = inf_pb.GenerateResponse(
            token_ids=list(range(2, generated + 1)),
            finish_reason=common_pb2.FINISH_REASON_CANCELLED,
            usage=common_pb2.Usage(completion_tokens=generated),
        )
        yield final.SerializeToString()

    async def stop(self, request: bytes, context: Any) -> bytes:
        if not self.implements_stop:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no Stop here")
        self.stopped.set()
        return inf_pb.StopResponse(stopped=1).SerializeToString()


def stoppable_spec(replica: Stoppable) -> Any:
    return bytes_service(
        "llmapi.inference.v1.InferenceService",
        unary={"Stop": replica.stop},
        server_streaming={"Generate": replica.generate},
    )


@contextlib.asynccontextmanager
async def client_call(server: RunningServer) -> AsyncIterator[GenerateCall]:
    """A Generate stream on `server` started by the router's own client (its Stop included)."""
    channels = ReplicaChannels()
    try:
        client = InferenceClient(channels)
        yield client.generate(
            server.target, inf_pb.GenerateRequest(request_id="r1"), stop_timeout_s=2.0
        )
    finally:
        await channels.close()


async def test_a_cancelled_reader_leaves_the_stream_to_be_stopped_and_counted() -> None:
    replica = Stoppable()
    async with running_server(stoppable_spec(replica)) as server, client_call(server) as call:
        assert (await call.next()) is not None
        # The caller goes away while waiting on the replica (as a router handler is
        # cancelled when its client cancels): the stream must survive for Stop.
        reader = asyncio.ensure_future(call.next())
        await asyncio.sleep(0.05)
        reader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reader
        total = await call.stop()
        assert total is not None
        assert total > 1  # the held tokens are counted
        assert not replica.cancelled.is_set()


async def test_a_replica_without_stop_is_cancelled_and_the_count_is_unknown() -> None:
    replica = Stoppable(implements_stop=False)
    async with running_server(stoppable_spec(replica)) as server, client_call(server) as call:
        assert (await call.next()) is not None
        assert await call.stop() is None
        await asyncio.wait_for(replica.cancelled.wait(), timeout=5.0)
