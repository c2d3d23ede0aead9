"""Where a generation's answer comes from: a replica's stream (LiveSource) or the response
cache (CachedSource), as Pieces in the same shape either way."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Collection
from dataclasses import dataclass
from typing import Protocol, TypeAlias

import grpc

from llm_common.errors import ServiceError
from llm_common.logging import get_logger
from llm_router.background import Background
from llm_router.errors import ReplicaFailed
from llm_router.routing.dispatch import Started
from llm_router.routing.load import Ticket
from llm_router.routing.replica_stream import GenerateCall
from llmapi.cache.v1 import cache_service_pb2 as cache_pb
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as inf_pb

STOP = common_pb2.FINISH_REASON_STOP
ERROR = common_pb2.FINISH_REASON_ERROR
UNSET = common_pb2.FINISH_REASON_UNSPECIFIED
DATA_LOSS = grpc.StatusCode.DATA_LOSS
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
_log = get_logger(__name__)
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

    async def resume(
        self, started: Started, resume: inf_pb.Resume, exclude: Collection[str]
    ) -> Started:
        """The request continued on another replica; Unavailable when none can take it."""
        ...


class LiveSource:
    """Relays a replica's Generate stream, starting with the message already received.

    When the replica breaks after output began (the stream fails, ends without a final
    message, or finishes with ERROR because the replica shut down), the request moves to
    another replica with what was delivered so far (mid-stream migration) and the relay goes
    on from there: the caller sees one stream, each token once. With no replica left the
    stream ends as before, with the original failure.
    """

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
        self._delivered: list[int] = []  # token ids relayed so far
        self._text_chars = 0  # characters of text relayed so far
        self._broken: set[str] = set()  # replicas this request failed on
        self.migrations = 0

    async def pieces(self) -> AsyncGenerator[Piece, None]:
        message: inf_pb.GenerateResponse | None = self._started.first
        try:
            while True:
                if message is None:  # a stream must end with a final message: it broke
                    message = await self._migrate(ReplicaFailed(self.replica, DATA_LOSS))
                    continue
                if message.finish_reason == ERROR:  # the replica gave up (shutting down)
                    yield self._piece(message, UNSET)
                    message = await self._migrate(ReplicaFailed(self.replica, UNAVAILABLE))
                    continue
                finished = bool(message.finish_reason)
                if finished:
                    # The final message carries everything the answer needs; the stream's
                    # end (the replica's status) is read in the background, off the answer's
                    # path, so the call still completes instead of being cancelled.
                    self._done = True
                    self._background.spawn(self._drain())
                yield self._piece(message, message.finish_reason)
                if finished:
                    return
                try:
                    message = await self._call.next()
                except ReplicaFailed as failure:
                    message = await self._migrate(failure)
        except ReplicaFailed:
            self._ended = True
            raise
        except ServiceError:
            self._ended = True  # the stream is over (a deadline, a client error): no Stop
            raise

    def _piece(self, message: inf_pb.GenerateResponse, finish: FinishReason) -> Piece:
        self._delivered.extend(message.token_ids)
        self._text_chars += len(message.text_delta)
        return Piece(
            text=message.text_delta,
            token_ids=tuple(message.token_ids),
            logprobs=tuple(message.logprobs),
            finish_reason=finish,
            cached_tokens=message.usage.cached_tokens if finish else None,
        )

    async def _migrate(self, failure: ReplicaFailed) -> inf_pb.GenerateResponse:
        """Move the request off the broken replica; re-raise `failure` when none can take it."""
        self._call.cancel()
        self._releaser.fail(self.replica)
        self._releaser.finish(self._started.placed.ticket)
        self._broken.add(self.replica)
        resume = inf_pb.Resume(token_ids=self._delivered, text_sent_chars=self._text_chars)
        try:
            started = await self._releaser.resume(self._started, resume, self._broken)
        except (ServiceError, ReplicaFailed):
            _log.warning("stream lost: no replica to resume it", replica=self.replica)
            raise failure from None
        _log.warning(
            "stream migrated",
            replica=self.replica,
            to=started.placed.choice.replica,
            code=failure.code.name,
            delivered_tokens=len(self._delivered),
        )
        self._started, self._call = started, started.call
        self.replica = started.placed.choice.replica
        self.migrations += 1
        return started.first

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
