"""Jittered exponential backoff and an asyncio circuit breaker on pybreaker's state machine."""

from __future__ import annotations

import asyncio
import enum
import functools
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import pybreaker
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from llm_common.logging import get_logger

P = ParamSpec("P")
T = TypeVar("T")
_log = get_logger(__name__)


def backoff_delay(
    attempt: int, *, base: float, cap: float, jitter: float, rng: random.Random | None = None
) -> float:
    """t_n = min(base·2^(n−1) + U(0, jitter), cap) for attempt n >= 1."""
    if attempt < 1:
        raise ValueError("attempt must be >= 1")
    if not all(math.isfinite(x) and x >= 0 for x in (base, cap, jitter)):
        raise ValueError("base, cap and jitter must be finite and >= 0")
    try:
        exponential = base * 2.0 ** (attempt - 1)
    except OverflowError:  # very late attempts: the cap applies anyway
        exponential = math.inf
    return min(exponential + (rng or random).uniform(0.0, jitter), cap)


@dataclass(frozen=True, slots=True)
class Backoff:
    """A retry schedule; iterating yields one delay per retry, at most `max_attempts` of them
    (None: unbounded)."""

    base: float = 0.1
    cap: float = 10.0
    jitter: float = 0.1
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        backoff_delay(1, base=self.base, cap=self.cap, jitter=self.jitter)  # validates
        if self.max_attempts is not None and self.max_attempts < 0:
            raise ValueError("max_attempts must be >= 0")

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """The delay before retry `attempt` (1-based)."""
        return backoff_delay(attempt, base=self.base, cap=self.cap, jitter=self.jitter, rng=rng)

    def delays(self, rng: random.Random | None = None) -> Iterator[float]:
        """t_1, t_2, … up to `max_attempts` delays."""
        attempt = 1
        while self.max_attempts is None or attempt <= self.max_attempts:
            yield self.delay(attempt, rng)
            attempt += 1

    def __iter__(self) -> Iterator[float]:
        return self.delays()


class BreakerState(enum.IntEnum):
    """Breaker states, valued as exported by the `llm_breaker_state` gauge."""

    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


_STATES = {
    pybreaker.STATE_CLOSED: BreakerState.CLOSED,
    pybreaker.STATE_HALF_OPEN: BreakerState.HALF_OPEN,
    pybreaker.STATE_OPEN: BreakerState.OPEN,
}


class BreakerMetrics:
    """`llm_breaker_state{breaker}` (0 closed, 1 half-open, 2 open) and
    `llm_breaker_opened_total{breaker}`, bound to one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else REGISTRY
        self.state = Gauge(
            "llm_breaker_state",
            "Circuit breaker state: 0 closed, 1 half-open, 2 open.",
            ["breaker"],
            registry=registry,
        )
        self.opened = Counter(
            "llm_breaker_opened", "Transitions into the open state.", ["breaker"], registry=registry
        )


@functools.cache
def default_breaker_metrics() -> BreakerMetrics:
    """The process-wide BreakerMetrics on the global registry, created on first use."""
    return BreakerMetrics()


class BreakerOpen(Exception):
    """The breaker is open (or its half-open trial is busy): the call was not attempted."""

    def __init__(self, name: str) -> None:
        super().__init__(f"circuit breaker {name!r} is open")
        self.name = name


class _Listener(pybreaker.CircuitBreakerListener):
    def __init__(self, on_change: Callable[[BreakerState], None]) -> None:
        self._on_change = on_change

    def state_change(
        self,
        cb: pybreaker.CircuitBreaker,
        old_state: pybreaker.CircuitBreakerState | None,
        new_state: pybreaker.CircuitBreakerState,
    ) -> None:
        self._on_change(_STATES[new_state.name])


class AsyncBreaker:
    """A circuit breaker for coroutines around pybreaker.CircuitBreaker.

    pybreaker keeps the counters and transitions; this class adds what async callers need:
    it fails fast with BreakerOpen while open, lets exactly one trial through when half-open,
    and reports each awaited outcome back to pybreaker. Cancellation is not an outcome.
    `exclude` lists business exceptions that do not count as failures.
    """

    def __init__(
        self,
        name: str,
        *,
        fail_max: int = 5,
        reset_timeout_s: float = 30.0,
        exclude: Iterable[type[BaseException]] = (),
        metrics: BreakerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._clock = clock
        self._metrics = metrics or default_breaker_metrics()
        self._opened_at = -math.inf
        self._trial_in_flight = False
        self._breaker = pybreaker.CircuitBreaker(
            fail_max=fail_max,
            reset_timeout=reset_timeout_s,
            exclude=list(exclude),
            listeners=[_Listener(self._on_state_change)],
            name=name,
            throw_new_error_on_trip=False,
        )
        self._metrics.state.labels(name).set(BreakerState.CLOSED)

    @property
    def state(self) -> BreakerState:
        """The current state (OPEN until a call after the reset timeout half-opens it)."""
        return _STATES[self._breaker.current_state]

    @property
    def fail_counter(self) -> int:
        """Consecutive failures counted so far."""
        return self._breaker.fail_counter

    async def call(self, fn: Callable[P, Awaitable[T]], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Await `fn(*args, **kwargs)` under the breaker; BreakerOpen when it may not run."""
        trial = self._admit()
        try:
            result = await fn(*args, **kwargs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._record(exc)
            raise
        finally:
            if trial:
                self._trial_in_flight = False
        self._record(None)
        return result

    def _admit(self) -> bool:
        state = self.state
        if state is BreakerState.OPEN:
            if self._clock() < self._opened_at + self._breaker.reset_timeout:
                raise BreakerOpen(self.name)
            self._breaker.half_open()
            state = BreakerState.HALF_OPEN
        if state is BreakerState.HALF_OPEN:
            if self._trial_in_flight:
                raise BreakerOpen(self.name)
            self._trial_in_flight = True
            return True
        return False

    def _record(self, error: Exception | None) -> None:
        # Replaying the outcome through CircuitBreaker.call keeps pybreaker's own rules
        # (counting, exclusions, transitions, listeners) authoritative.
        traceback = error.__traceback__ if error is not None else None

        def replay() -> None:
            if error is not None:
                raise error

        try:
            self._breaker.call(replay)
        except pybreaker.CircuitBreakerError:
            pass  # opened meanwhile by a concurrent call; this outcome is stale
        except Exception as raised:
            if raised is not error:
                raise
        finally:
            if error is not None:
                error.with_traceback(traceback)

    def _on_state_change(self, state: BreakerState) -> None:
        self._metrics.state.labels(self.name).set(state)
        if state is BreakerState.OPEN:
            self._opened_at = self._clock()
            self._metrics.opened.labels(self.name).inc()
            _log.warning("circuit breaker opened", breaker=self.name)
        else:
            _log.info("circuit breaker state", breaker=self.name, state=state.name.lower())
