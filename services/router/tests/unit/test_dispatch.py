"""Dispatch with failover: jittered backoff re-dispatch before the first token, exclusion,
UNAVAILABLE with RetryInfo when no replica is left (fake inference client)."""

from __future__ import annotations

import random
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry

from llm_common.errors import InvalidArgument, Unavailable
from llm_common.models_config import Deployment
from llm_router.errors import ReplicaFailed
from llm_router.observability import RouterMetrics
from llm_router.routing.dispatch import Dispatcher
from llm_router.routing.load import LoadBoard, LoadSnapshot
from llm_router.routing.prefix import AffinityTable
from llm_router.routing.selection import ReplicaSelector
from llm_router.routing.settings import RoutingSettings
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as inf_pb

from .conftest import ManualClock

SETTINGS = RoutingSettings(
    dispatch_attempts=3, retry_base_s=0.1, retry_cap_s=1.0, retry_jitter_s=0.05
)


class FakeCall:
    def __init__(self, replica: str, outcome: Any) -> None:
        self.replica = replica
        self.outcome = outcome
        self.cancelled = False

    async def next(self) -> inf_pb.GenerateResponse | None:
        if isinstance(self.outcome, BaseException):
            raise self.outcome
        return self.outcome

    def cancel(self) -> None:
        self.cancelled = True


class FakeInference:
    """Answers per replica: a first message, or an exception to raise before it."""

    def __init__(self, outcomes: dict[str, Any]) -> None:
        self.outcomes = outcomes
        self.calls: list[FakeCall] = []
        self.requests: list[inf_pb.GenerateRequest] = []

    def generate(
        self, replica: str, request: inf_pb.GenerateRequest, *, stop_timeout_s: float = 1.0
    ) -> FakeCall:
        self.requests.append(request)
        call = FakeCall(replica, self.outcomes[replica])
        self.calls.append(call)
        return call


def first() -> inf_pb.GenerateResponse:
    return inf_pb.GenerateResponse(token_ids=[5], text_delta="x")


def build(
    clock: ManualClock, outcomes: dict[str, Any]
) -> tuple[Dispatcher, FakeInference, LoadBoard, list[float], CollectorRegistry]:
    board = LoadBoard(exclude_s=5, exclude_max_s=60, stale_s=5, clock=clock)
    for replica in outcomes:
        board.report(replica, LoadSnapshot(max_num_seqs=8))
    selector = ReplicaSelector(
        board, AffinityTable(max_entries=100, ttl_s=60, clock=clock), SETTINGS, random.Random(1)
    )
    fake = FakeInference(outcomes)
    sleeps: list[float] = []

    async def sleep(seconds: float) -> None:
        sleeps.append(seconds)

    registry = CollectorRegistry()
    dispatcher = Dispatcher(
        selector,
        board,
        fake,
        SETTINGS,
        RouterMetrics(registry),
        sleep=sleep,
        rng=random.Random(2),  # type: ignore[arg-type]
    )
    return dispatcher, fake, board, sleeps, registry


def dep(name: str, *replicas: str, weight: int = 100) -> Deployment:
    return Deployment(name=name, replicas=replicas, weight=weight)


async def generate(dispatcher: Dispatcher, *deployments: Deployment) -> Any:
    return await dispatcher.generate(
        "m", deployments, list(range(40)), common_pb2.SamplingParams(max_tokens=8)
    )


async def test_failover_before_first_token_with_jittered_backoff(clock: ManualClock) -> None:
    broken = ReplicaFailed("a:1", grpc.StatusCode.UNAVAILABLE)
    dispatcher, fake, board, sleeps, registry = build(clock, {"a:1": broken, "b:1": first()})
    started = await generate(dispatcher, dep("primary", "a:1"), dep("fallback", "b:1"))
    assert started.placed.choice.replica == "b:1"
    assert started.placed.attempts == 2
    assert [c.replica for c in fake.calls] == ["a:1", "b:1"]
    assert fake.calls[0].cancelled
    assert len(sleeps) == 1
    assert 0.1 <= sleeps[0] <= 0.15  # base + U(0, jitter)
    assert board.health("a:1") == "excluded"
    assert board.requests("a:1") == 0  # the failed attempt's ticket was released
    assert board.requests("b:1") == 1  # the running one holds its ticket
    assert (
        registry.get_sample_value(
            "llm_router_failovers_total", {"model": "m", "replica": "a:1", "code": "UNAVAILABLE"}
        )
        == 1
    )
    dispatcher.finish(started.placed.ticket)
    assert board.requests("b:1") == 0


async def test_backoff_grows_and_unavailable_carries_retry_info(clock: ManualClock) -> None:
    outcomes = {r: ReplicaFailed(r, grpc.StatusCode.INTERNAL) for r in ("a:1", "b:1", "c:1")}
    dispatcher, fake, _, sleeps, _ = build(clock, outcomes)
    with pytest.raises(Unavailable) as exc:
        await generate(dispatcher, dep("d", "a:1", "b:1", "c:1"))
    assert len(fake.calls) == 3
    assert len({c.replica for c in fake.calls}) == 3  # never the same replica twice
    assert len(sleeps) == 2
    assert 0.1 <= sleeps[0] <= 0.15
    assert 0.2 <= sleeps[1] <= 0.25
    assert exc.value.retry_after_s == pytest.approx(5.0)
    assert exc.value.code == grpc.StatusCode.UNAVAILABLE


async def test_busy_replicas_are_not_excluded(clock: ManualClock) -> None:
    busy = ReplicaFailed("a:1", grpc.StatusCode.RESOURCE_EXHAUSTED, exclude=False)
    dispatcher, _, board, _, _ = build(clock, {"a:1": busy, "b:1": first()})
    started = await generate(dispatcher, dep("d", "a:1", "b:1"))
    assert started.placed.choice.replica in {"a:1", "b:1"}
    assert board.health("a:1") != "excluded"


async def test_client_errors_are_not_retried(clock: ManualClock) -> None:
    bad = InvalidArgument([])
    dispatcher, fake, board, sleeps, _ = build(clock, {"a:1": bad, "b:1": bad})
    with pytest.raises(InvalidArgument):
        await generate(dispatcher, dep("d", "a:1", "b:1"))
    assert len(fake.calls) == 1
    assert sleeps == []
    assert board.requests("a:1") + board.requests("b:1") == 0


async def test_an_empty_stream_counts_as_a_replica_failure(clock: ManualClock) -> None:
    dispatcher, _, board, _, _ = build(clock, {"a:1": None, "b:1": first()})
    started = await generate(dispatcher, dep("primary", "a:1"), dep("fallback", "b:1"))
    assert started.placed.choice.replica == "b:1"
    assert board.health("a:1") == "excluded"


async def test_no_usable_replica_fails_without_calling(clock: ManualClock) -> None:
    dispatcher, fake, board, _, _ = build(clock, {"a:1": first()})
    board.fail("a:1")
    assert not dispatcher.has_usable_replica([dep("d", "a:1")])
    with pytest.raises(Unavailable) as exc:
        await generate(dispatcher, dep("d", "a:1"))
    assert fake.calls == []
    assert exc.value.retry_after_s == pytest.approx(5.0)


async def test_streamed_and_unary_answers_ask_for_their_own_token_grouping(
    clock: ManualClock,
) -> None:
    dispatcher, fake, _, _, _ = build(clock, {"a:1": first()})
    sampling = common_pb2.SamplingParams(max_tokens=8)
    for stream in (True, False):
        started = await dispatcher.generate("m", [dep("d", "a:1")], [1, 2], sampling, stream=stream)
        dispatcher.finish(started.placed.ticket)
    streamed, unary = (r.delivery for r in fake.requests)
    assert (streamed.max_tokens_per_message, streamed.max_hold_ms) == (
        SETTINGS.tokens_per_message,
        SETTINGS.max_hold_ms,
    )
    assert unary.max_tokens_per_message == SETTINGS.unary_tokens_per_message
    assert unary.max_hold_ms == 0  # nobody sees a unary answer before it is whole
    assert len({r.request_id for r in fake.requests}) == 2  # Stop must find one stream only
