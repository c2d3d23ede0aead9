"""Generation: the output guard on a live answer, finish reasons, and settlement on every
way a request ends (finished, filtered, failed, cancelled, abandoned)."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from llm_common.errors import Unavailable
from llm_router.api.identity import Caller
from llm_router.background import Background
from llm_router.errors import ReplicaFailed
from llm_router.generation.relay import Chunk, Generation, RequestInfo
from llm_router.generation.sources import Piece
from llm_router.observability import RouterMetrics
from llm_router.requests import GenerationRequest, Kind
from llm_router.safety.policies import parse_policies
from llm_router.settlement.settle import Admission, Outcome
from llmapi.common.v1 import common_pb2

FR = common_pb2


class FakeSource:
    replica = "r:1"
    route_reason = "load"
    cache_hit = "miss"
    similarity = 0.0
    running = False  # every piece is in hand: nothing to stop

    def __init__(self, pieces: list[Piece | BaseException]) -> None:
        self._pieces = pieces
        self.closed = False

    async def pieces(self) -> AsyncGenerator[Piece, None]:
        for piece in self._pieces:
            if isinstance(piece, BaseException):
                raise piece
            yield piece

    async def stop(self) -> int | None:
        return None

    def close(self) -> None:
        self.closed = True


class RecordingSettler:
    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []

    def submit(self, admission: Admission, outcome: Outcome) -> None:
        self.outcomes.append(outcome)


def make(
    pieces: list[Piece | BaseException], *, stream: bool = True, blocklist: tuple[str, ...] = ()
) -> tuple[Generation, FakeSource, RecordingSettler, CollectorRegistry]:
    registry = CollectorRegistry()
    settler = RecordingSettler()
    source = FakeSource(pieces)
    policy = parse_policies({"default": {"output": {"blocklist": list(blocklist)}}}).default.output
    request = GenerationRequest(kind=Kind.CHAT, model="m", sampling=common_pb2.SamplingParams())
    info = RequestInfo(
        "rid",
        Caller("t", "k", frozenset()),
        request,
        "m",
        7,
        common_pb2.SamplingParams(),
        stream,
        0.0,
    )
    admission = Admission("b", "t", "k", "k", "m", 7, 10, 17, True, 0.0)
    deps = Generation.Deps(
        settler=settler,
        metrics=RouterMetrics(registry),
        background=Background(),
        cache=None,
        cache_key=None,
    )  # type: ignore[arg-type]
    return Generation(info, source, policy, admission, deps), source, settler, registry


def piece(
    text: str, n: int = 1, finish: int = FR.FINISH_REASON_UNSPECIFIED, cached: int | None = None
) -> Piece:
    return Piece(text=text, token_ids=tuple(range(n)), finish_reason=finish, cached_tokens=cached)  # type: ignore[arg-type]


async def collect(generation: Generation) -> list[Chunk]:
    return [chunk async for chunk in generation.chunks()]


async def test_finished_answer_with_pii_split_across_pieces() -> None:
    pieces = [
        piece("Mail me at jo"),
        piece("hn@exam"),
        piece("ple.com today"),
        piece(".", finish=FR.FINISH_REASON_STOP, cached=4),
    ]
    generation, source, settler, _ = make(pieces)
    chunks = await collect(generation)
    assert "".join(c.text for c in chunks) == "Mail me at [EMAIL] today."
    assert "jo" not in "".join(c.text for c in chunks[:-1])
    last = chunks[-1]
    assert last.finish_reason == FR.FINISH_REASON_STOP
    assert last.usage is not None
    assert (last.usage.prompt_tokens, last.usage.completion_tokens, last.usage.cached_tokens) == (
        7,
        4,
        4,
    )
    assert all(c.usage is None and c.finish_reason == 0 for c in chunks[:-1])
    assert source.closed
    assert settler.outcomes == [Outcome(7, 4, 4, FR.FINISH_REASON_STOP, True)]


async def test_blocked_phrase_stops_with_content_filter_and_bills_what_was_made() -> None:
    pieces = [
        piece("all is "),
        piece("fi"),
        piece("ne and "),
        piece("dandy"),
        piece(" more", finish=FR.FINISH_REASON_STOP),
    ]
    generation, source, settler, registry = make(pieces, blocklist=("fine and dandy",))
    chunks = await collect(generation)
    assert "".join(c.text for c in chunks) == "all is "
    assert chunks[-1].finish_reason == FR.FINISH_REASON_CONTENT_FILTER
    assert source.closed
    assert settler.outcomes[0].completion_tokens == 5  # "dandy" was final only with " more"
    assert settler.outcomes[0].finish_reason == FR.FINISH_REASON_CONTENT_FILTER
    assert (
        registry.get_sample_value(
            "llm_router_guard_actions_total", {"direction": "output", "action": "blocked"}
        )
        == 1
    )


async def test_cancelled_mid_stream_settles_tokens_so_far() -> None:
    generation, source, settler, _ = make(
        [piece("a "), piece("b "), piece("c "), piece("d", finish=FR.FINISH_REASON_STOP)]
    )
    async with aclosing(generation.chunks()) as chunks:
        first = await chunks.__anext__()
        assert first.text == "a "
    assert source.closed
    (outcome,) = settler.outcomes
    assert outcome.finish_reason == FR.FINISH_REASON_CANCELLED
    assert outcome.completion_tokens == 1
    generation.abandon()  # idempotent after close
    assert len(settler.outcomes) == 1


async def test_replica_lost_mid_stream() -> None:
    lost = ReplicaFailed("r:1", grpc.StatusCode.UNAVAILABLE)
    generation, _, settler, _ = make([piece("a "), piece("b "), lost])
    chunks = await collect(generation)
    assert chunks[-1].finish_reason == FR.FINISH_REASON_ERROR
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 2
    assert settler.outcomes[0].finish_reason == FR.FINISH_REASON_ERROR
    unary, _, _, _ = make([piece("a "), lost], stream=False)
    with pytest.raises(Unavailable):
        await collect(unary)


async def test_abandoned_before_iteration_is_settled_as_nothing() -> None:
    generation, source, settler, _ = make([piece("x", finish=FR.FINISH_REASON_STOP)])
    generation.abandon()
    assert source.closed
    assert settler.outcomes == [Outcome(7, 0, 0, FR.FINISH_REASON_CANCELLED, False)]


async def test_logprobs_follow_the_text_they_belong_to() -> None:
    lp = common_pb2.TokenLogprob(token_id=1, token="a", logprob=-0.5)
    pieces: list[Any] = [
        Piece(text="a ", token_ids=(1,), logprobs=(lp,)),
        Piece(text="", token_ids=(2,), finish_reason=FR.FINISH_REASON_LENGTH),
    ]
    generation, _, _, _ = make(pieces)
    chunks = await collect(generation)
    assert [len(c.logprobs) for c in chunks] == [1, 0]
    assert chunks[-1].finish_reason == FR.FINISH_REASON_LENGTH
