"""Backoff schedule and the asyncio circuit breaker."""

from __future__ import annotations

import asyncio
import random
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from llm_common.resilience import (
    AsyncBreaker,
    Backoff,
    BreakerMetrics,
    BreakerOpen,
    BreakerState,
    backoff_delay,
)

finite = st.floats(min_value=0.0, max_value=100.0, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(
    attempt=st.integers(min_value=1, max_value=80),
    base=finite,
    cap=finite,
    jitter=finite,
    seed=st.integers(0, 2**32),
)
def test_delay_within_bounds(
    attempt: int, base: float, cap: float, jitter: float, seed: int
) -> None:
    delay = backoff_delay(attempt, base=base, cap=cap, jitter=jitter, rng=random.Random(seed))
    exponential = base * 2 ** (attempt - 1)
    assert min(exponential, cap) <= delay <= min(exponential + jitter, cap)


def test_huge_attempts_are_capped() -> None:
    assert backoff_delay(5000, base=0.1, cap=3.0, jitter=1.0) == 3.0


def test_delays_spread_with_mean_near_expected() -> None:
    rng = random.Random(7)
    samples = [backoff_delay(3, base=0.1, cap=10.0, jitter=0.2, rng=rng) for _ in range(4000)]
    assert len(set(samples)) > 3000
    assert statistics.fmean(samples) == pytest.approx(0.4 + 0.1, abs=0.01)  # base·4 + jitter/2
    assert min(samples) >= 0.4
    assert max(samples) <= 0.6


@pytest.mark.parametrize(
    ("attempt", "base", "cap", "jitter"),
    [
        (0, 1, 1, 1),
        (-1, 1, 1, 1),
        (1, -1, 1, 1),
        (1, 1, -1, 1),
        (1, 1, 1, -1),
        (1, float("nan"), 1, 1),
    ],
)
def test_invalid_parameters(attempt: int, base: float, cap: float, jitter: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        backoff_delay(attempt, base=base, cap=cap, jitter=jitter)


def test_backoff_iterates_max_attempts() -> None:
    schedule = Backoff(base=1.0, cap=5.0, jitter=0.0, max_attempts=5)
    assert list(schedule) == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert list(Backoff(max_attempts=0)) == []
    unbounded = iter(Backoff(base=0.01, cap=0.02, jitter=0.0))
    assert [next(unbounded) for _ in range(50)][-1] == 0.02
    with pytest.raises(ValueError, match="finite and >= 0"):
        Backoff(base=-1.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class BoomError(Exception):
    pass


class NotMyFaultError(Exception):
    pass


async def fail() -> None:
    raise BoomError("down")


async def succeed(value: int = 1) -> int:
    return value


def _breaker(registry: CollectorRegistry, clock: Clock, **kwargs: object) -> AsyncBreaker:
    return AsyncBreaker(
        "cache",
        fail_max=3,
        reset_timeout_s=5.0,
        metrics=BreakerMetrics(registry),
        clock=clock,
        **kwargs,  # type: ignore[arg-type]
    )


def _state(breaker: AsyncBreaker) -> BreakerState:
    return breaker.state  # a call, so mypy does not carry narrowing across awaits


def _gauge(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("llm_breaker_state", {"breaker": "cache"})


def _opened(registry: CollectorRegistry) -> float | None:
    return registry.get_sample_value("llm_breaker_opened_total", {"breaker": "cache"})


async def test_breaker_lifecycle(registry: CollectorRegistry) -> None:
    clock = Clock()
    breaker = _breaker(registry, clock)
    assert await breaker.call(succeed, 5) == 5
    assert _gauge(registry) == 0
    for _ in range(3):
        with pytest.raises(BoomError):
            await breaker.call(fail)
    assert breaker.state is BreakerState.OPEN
    assert (_gauge(registry), _opened(registry)) == (2, 1)

    calls = 0

    async def counted() -> int:
        nonlocal calls
        calls += 1
        return calls

    with pytest.raises(BreakerOpen):  # fails fast: the callable is not invoked
        await breaker.call(counted)
    assert calls == 0

    clock.now += 5.0  # reset timeout elapsed: the next call is the half-open trial
    trial_started, release = asyncio.Event(), asyncio.Event()

    async def trial() -> str:
        trial_started.set()
        await release.wait()
        return "ok"

    task = asyncio.create_task(breaker.call(trial))
    await trial_started.wait()
    assert _state(breaker) is BreakerState.HALF_OPEN
    assert _gauge(registry) == 1
    with pytest.raises(BreakerOpen):  # only one trial at a time
        await breaker.call(counted)
    release.set()
    assert await task == "ok"
    assert _state(breaker) is BreakerState.CLOSED
    assert (_gauge(registry), _opened(registry)) == (0, 1)


async def test_failed_trial_reopens(registry: CollectorRegistry) -> None:
    clock = Clock()
    breaker = _breaker(registry, clock)
    for _ in range(3):
        with pytest.raises(BoomError):
            await breaker.call(fail)
    clock.now += 5.0
    with pytest.raises(BoomError):
        await breaker.call(fail)
    assert breaker.state is BreakerState.OPEN
    assert _opened(registry) == 2
    clock.now += 4.9  # the timeout restarts from the failed trial
    with pytest.raises(BreakerOpen):
        await breaker.call(succeed)


async def test_excluded_errors_and_cancellation_do_not_count(registry: CollectorRegistry) -> None:
    breaker = _breaker(registry, Clock(), exclude=[NotMyFaultError])

    async def business_error() -> None:
        raise NotMyFaultError

    async def hang() -> None:
        await asyncio.Event().wait()

    for _ in range(5):
        with pytest.raises(NotMyFaultError):
            await breaker.call(business_error)
        task = asyncio.create_task(breaker.call(hang))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert breaker.state is BreakerState.CLOSED
    assert breaker.fail_counter == 0


async def test_success_resets_the_failure_count(registry: CollectorRegistry) -> None:
    breaker = _breaker(registry, Clock())
    for _ in range(5):
        for _ in range(2):
            with pytest.raises(BoomError):
                await breaker.call(fail)
        await breaker.call(succeed)
    assert breaker.state is BreakerState.CLOSED


async def test_original_error_and_traceback_propagate(registry: CollectorRegistry) -> None:
    breaker = _breaker(registry, Clock())
    with pytest.raises(BoomError, match="down") as info:
        await breaker.call(fail)
    assert info.value.__traceback__ is not None
    frames = [frame.name for frame in info.traceback]
    assert "replay" not in frames
