"""Where a generation's answer comes from: a replica's stream (LiveSource) or the response
cache (CachedSource), as Pieces in the same shape either way."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Protocol, TypeAlias

import grpc

from llm_common.errors import ServiceError
from llm_router.background import Background
from llm_router.errors import ReplicaFailed
from llm_router.routing.dispatch import Started
from llm_router.routing.load import Ticket
from llm_router.routing.replica_stream import GenerateCall
from llmapi.cache.v1 import cache_service_pb2 as cache_pb
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as inf_pb

STOP = common_pb2.FINISH_REASON_STOP
UNSET = common_pb2.FINISH_REASON_UNSPECIFIED
FinishReason: TypeAlias = common_pb2.FinishReason.ValueType
_CACHE_HITS = {cache_pb.HIT_KIND_EXACT: "exact", cache_pb.HIT_KIND_SEMANTIC: "semantic"}


@dataclass(frozen=True, slots=True)
class Piece:
    """A piece of the model's answer as the source delivered it."""

    text: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[common_pb2.TokenLogprob, ...] = ()
    finish_reason: FinishReason = UNSET
    cached_tokens: int | None = None  # prompt tokens the replica had cached (last piece)


class Source(Protocol):
    """Where the answer comes from: a replica's stream or the response cache."""

    replica: str
    route_reason: str
    cache_hit: str  # "miss", "exact" or "semantic"
    similarity: float

    @property
    def running(self) -> bool:
        """Still producing: ending it now leaves tokens to count."""

    def pieces(self) -> AsyncGenerator[Piece, None]: ...

    async def stop(self) -> int | None:
        """End production early; the count of every token produced (None: unknown)."""

    def close(self) -> None:
        """Stop producing (cancel the replica's work) and release the load ticket."""


class CachedSource:
    """Replays a response-cache hit as one piece."""

    replica = ""
    route_reason = "cache"
    running = False

    def __init__(self, hit: cache_pb.LookupResponse) -> None:
        self._response = hit.response
        self.cache_hit = _CACHE_HITS.get(hit.kind, "exact")
        self.similarity = hit.similarity

    async def pieces(self) -> AsyncGenerator[Piece, None]:
        r = self._response
        yield Piece(
            text=r.text,
            token_ids=tuple(r.token_ids),
            finish_reason=r.finish_reason or STOP,
        )

    async def stop(self) -> int | None:
        return None

    def close(self) -> None:
        """Nothing runs for a cache hit."""


class Releaser(Protocol):
    def finish(self, ticket: Ticket) -> None: ...

    def fail(self, replica: str) -> None: ...


class LiveSource:
    """Relays a replica's Generate stream, starting with the message already received."""

    cache_hit = "miss"
    similarity = 0.0

    def __init__(self, started: Started, releaser: Releaser, background: Background) -> None:
        self._started = started
        self._call: GenerateCall = started.call
        self._releaser = releaser
        self._background = background
        self.replica = started.placed.choice.replica
        self.route_reason = started.placed.choice.reason
        self._done = False  # the final message arrived
        self._ended = False  # failed or stopped

    async def pieces(self) -> AsyncGenerator[Piece, None]:
        message: inf_pb.GenerateResponse | None = self._started.first
        try:
            while message is not None:
                finished = bool(message.finish_reason)
                if finished:
                    # The final message carries everything the answer needs; the stream's
                    # end (the replica's status) is read in the background, off the answer's
                    # path, so the call still completes instead of being cancelled.
                    self._done = True
                    self._background.spawn(self._drain())
                yield Piece(
                    text=message.text_delta,
                    token_ids=tuple(message.token_ids),
                    logprobs=tuple(message.logprobs),
                    finish_reason=message.finish_reason,
                    cached_tokens=message.usage.cached_tokens if finished else None,
                )
                if finished:
                    return
                message = await self._call.next()
            raise ReplicaFailed(self.replica, grpc.StatusCode.DATA_LOSS)
        except ReplicaFailed:
            self._ended = True
            self._releaser.fail(self.replica)
            raise
        except ServiceError:
            self._ended = True  # the stream is over (a deadline, a client error): no Stop
            raise

    @property
    def running(self) -> bool:
        return not (self._done or self._ended)

    async def stop(self) -> int | None:
        """Stop the stream on its replica and read it to its last message, which counts the
        tokens the replica generated, including any it held for a fuller message."""
        if not self.running:
            return None
        self._ended = True
        return await self._call.stop()

    async def _drain(self) -> None:
        # Read to the end of the stream so the call completes with its status instead of
        # being cancelled when it is dropped (the replica then sees a clean finish).
        with contextlib.suppress(ReplicaFailed, ServiceError):
            while await self._call.next() is not None:
                pass

    def close(self) -> None:
        if not self._done:
            self._call.cancel()  # frees the request's KV blocks on the replica
        self._releaser.finish(self._started.placed.ticket)
