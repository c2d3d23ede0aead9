"""Per-replica state for routing: the last load report, own in-flight work, exclusion."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    """What a replica reported about itself (inference LoadReport, in domain terms)."""

    num_waiting: int = 0
    num_running: int = 0
    kv_cache_usage: float = 0.0
    waiting_prompt_tokens: int = 0
    running_remaining_tokens: int = 0
    tokens_per_second: float = 0.0
    max_num_seqs: int = 1
    draining: bool = False  # shutting down: finishes its work, takes none


class Health:
    """How much the router knows about a replica."""

    FRESH = "fresh"  # a recent load report
    UNKNOWN = "unknown"  # no report yet, or a stale one: usable, but preferred last
    EXCLUDED = "excluded"  # failed recently: not used until its exclusion ends
    DRAINING = "draining"  # said it is shutting down: not used until it reports otherwise


@dataclass(slots=True)
class _Replica:
    report: LoadSnapshot | None = None
    reported_at: float = -math.inf
    excluded_until: float = -math.inf
    failures: int = 0
    # ticket -> (dispatched_at, work): this router's requests still running there.
    in_flight: dict[int, tuple[float, float]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Ticket:
    """One request dispatched to a replica; `LoadBoard.finish` it when the request ends."""

    replica: str
    number: int


class LoadBoard:
    """Load of every replica as the router sees it: the replica's last report plus the
    requests this router sent after that report was taken (the report cannot know them)."""

    def __init__(
        self,
        *,
        exclude_s: float,
        exclude_max_s: float,
        stale_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._replicas: dict[str, _Replica] = {}
        self._exclude_s = exclude_s
        self._exclude_max_s = exclude_max_s
        self._stale_s = stale_s
        self._clock = clock
        self._tickets = itertools.count(1)

    def _get(self, replica: str) -> _Replica:
        state = self._replicas.get(replica)
        if state is None:
            state = self._replicas[replica] = _Replica()
        return state

    def report(self, replica: str, snapshot: LoadSnapshot) -> None:
        """A fresh load report arrived."""
        state = self._get(replica)
        state.report = snapshot
        state.reported_at = self._clock()

    def lost(self, replica: str) -> None:
        """The load stream broke: the last report no longer describes the replica."""
        self._get(replica).reported_at = -math.inf

    def health(self, replica: str) -> str:
        """FRESH, UNKNOWN, EXCLUDED or DRAINING (see Health)."""
        state = self._get(replica)
        if self._clock() < state.excluded_until:
            return Health.EXCLUDED
        # Kept past the stream's end: a replica back at the same address reports afresh.
        if state.report is not None and state.report.draining:
            return Health.DRAINING
        return Health.FRESH if self._fresh(state) else Health.UNKNOWN

    def _fresh(self, state: _Replica) -> bool:
        return state.report is not None and self._clock() - state.reported_at <= self._stale_s

    def fail(self, replica: str) -> float:
        """Exclude `replica` after a failure, doubling the period per consecutive failure;
        returns the seconds it sits out."""
        state = self._get(replica)
        state.failures += 1
        period = min(self._exclude_s * 2.0 ** (state.failures - 1), self._exclude_max_s)
        state.excluded_until = self._clock() + period
        return period

    def succeed(self, replica: str) -> None:
        """The replica served a request: its failure streak ends."""
        state = self._get(replica)
        state.failures = 0
        state.excluded_until = -math.inf

    def retry_after(self, replicas: list[str]) -> float:
        """Seconds until the first of `replicas` comes back from exclusion (0 when one is in)."""
        now = self._clock()
        waits = [max(0.0, self._get(r).excluded_until - now) for r in replicas]
        return min(waits, default=0.0)

    def begin(self, replica: str, work: float) -> Ticket:
        """Count a request of `work` units as running on `replica`."""
        ticket = Ticket(replica, next(self._tickets))
        self._get(replica).in_flight[ticket.number] = (self._clock(), work)
        return ticket

    def prefilled(self, ticket: Ticket, work: float) -> None:
        """The request of `ticket` has its first token: its prompt is computed, `work` units
        (the tokens still to generate) remain. Until the replica's next load report counts it,
        its estimate must not keep the prefill: a sibling choice or a follow-up sent to the
        same warm replica would otherwise be charged a prompt already done."""
        state = self._get(ticket.replica)
        if ticket.number in state.in_flight:
            began, _ = state.in_flight[ticket.number]
            state.in_flight[ticket.number] = (began, work)

    def finish(self, ticket: Ticket) -> None:
        """The request of `ticket` ended (any outcome); idempotent."""
        self._get(ticket.replica).in_flight.pop(ticket.number, None)

    def queued_work(self, replica: str, prefill_weight: float) -> float:
        """Q_j: work ahead of a new request, in generated-token units: reported prompt tokens
        waiting (× prefill_weight) and tokens still to generate, plus own unreported work."""
        state = self._get(replica)
        reported = 0.0
        if state.report is not None and self._fresh(state):
            r = state.report
            reported = prefill_weight * r.waiting_prompt_tokens + r.running_remaining_tokens
        return reported + sum(work for _, work in self._unreported(state))

    def requests(self, replica: str) -> int:
        """Requests waiting or running on `replica` (reported + own unreported)."""
        state = self._get(replica)
        reported = 0
        if state.report is not None and self._fresh(state):
            reported = state.report.num_waiting + state.report.num_running
        return reported + len(self._unreported(state))

    def capacity(self, replica: str) -> int:
        """C_j: concurrent sequences the replica batches (1 until it has reported)."""
        report = self._get(replica).report
        return max(1, report.max_num_seqs) if report is not None else 1

    def _unreported(self, state: _Replica) -> list[tuple[float, float]]:
        # Requests sent before the report was taken are already in its queue numbers.
        if not self._fresh(state):
            return list(state.in_flight.values())
        return [item for item in state.in_flight.values() if item[0] >= state.reported_at]
