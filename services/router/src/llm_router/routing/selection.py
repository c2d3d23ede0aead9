"""Replica selection: least expected wait, credited with prefix-cache affinity, with an
override for imbalanced load; round-robin as the baseline."""

from __future__ import annotations

import itertools
import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from llm_router.routing.load import Health, LoadBoard
from llm_router.routing.prefix import AffinityTable, prefix_chain
from llm_router.routing.settings import RoutingSettings

REASON_AFFINITY = "affinity"  # the replica holding the longest prefix had the least wait
REASON_LOAD = "load"  # least expected wait without a prefix advantage
REASON_IMBALANCE = "imbalance"  # load too uneven: the least loaded replica, affinity ignored
REASON_ROUND_ROBIN = "round_robin"
_USABLE = (Health.FRESH, Health.UNKNOWN)
REASON_UNKNOWN = "unknown_load"  # no fresh load report from any usable replica


@dataclass(frozen=True, slots=True)
class Job:
    """What selection needs to know about a request."""

    deployment: str
    chain: tuple[int, ...]  # prefix block hashes (empty: no affinity, e.g. embeddings)
    prompt_tokens: int
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Choice:
    """The replica picked for a job and why."""

    replica: str
    reason: str
    cached_blocks: int  # leading prompt blocks the replica is believed to hold
    work: float  # t̂: the job's cost on that replica, in generated-token units
    expected_wait: float  # (Q_j + t̂)/C_j


class ReplicaSelector:
    """Scores replicas by expected wait (Q_j + t̂_ij) / C_j and picks the least.

    Q_j is the replica's queued work (LoadBoard), C_j its batch capacity, and t̂_ij this job's
    work there: prefill_weight × (prompt tokens not already cached on j) + max_tokens. Prefix
    affinity enters as the cached-token credit, so a warm replica wins unless its queue costs
    more than the prefill it saves (the Dynamo KV-router trade-off). When in-flight requests
    are imbalanced (max − min > imbalance_abs and max > min × imbalance_rel, SGLang's rule) the
    least loaded replica is taken instead. Replicas with fresh reports are preferred over
    those of unknown load; excluded replicas are never chosen.
    """

    def __init__(
        self,
        board: LoadBoard,
        affinity: AffinityTable,
        settings: RoutingSettings,
        rng: random.Random | None = None,
    ) -> None:
        self._board = board
        self._affinity = affinity
        self._settings = settings
        self._rng = rng or random.Random()
        self._round_robin: dict[str, itertools.count[int]] = {}

    def chain(self, deployment: str, tokens: Sequence[int]) -> tuple[int, ...]:
        """The prefix block hashes of a prompt for `deployment` (empty for round-robin)."""
        if self._settings.balancer == "round_robin":
            return ()
        return prefix_chain(
            tokens,
            block_tokens=self._settings.block_tokens,
            max_blocks=self._settings.max_prefix_blocks,
            salt=deployment,
        )

    def choose(
        self, job: Job, replicas: Sequence[str], exclude: Collection[str] = ()
    ) -> Choice | None:
        """The replica for `job` among `replicas` minus `exclude`; None when none is usable."""
        usable = [r for r in replicas if r not in exclude and self._board.health(r) in _USABLE]
        if not usable:
            return None
        fresh = [r for r in usable if self._board.health(r) == Health.FRESH]
        pool = fresh or usable
        if self._settings.balancer == "round_robin":
            return self._next_in_turn(job, pool)
        choice = self._least_wait(job, pool)
        if not fresh and choice.reason == REASON_LOAD:
            return _with_reason(choice, REASON_UNKNOWN)
        return choice

    def record(self, job: Job, replica: str) -> None:
        """`replica` received `job`: its prefix blocks are (about to be) cached there."""
        if job.chain:
            self._affinity.record(job.chain, replica)

    def forget(self, replica: str) -> None:
        """`replica` restarted: nothing is cached there any more."""
        self._affinity.forget(replica)

    def _next_in_turn(self, job: Job, pool: Sequence[str]) -> Choice:
        counter = self._round_robin.setdefault(job.deployment, itertools.count())
        replica = pool[next(counter) % len(pool)]
        work = self._work(job, 0)
        return Choice(replica, REASON_ROUND_ROBIN, 0, work, self._wait(replica, work))

    def _least_wait(self, job: Job, pool: Sequence[str]) -> Choice:
        matches = self._affinity.matches(job.chain, pool) if job.chain else {}
        scored: list[tuple[float, int, int, float, str]] = []
        for replica in pool:
            blocks = matches.get(replica, 0)
            work = self._work(job, blocks)
            wait = self._wait(replica, work)
            # Ties: more cached blocks, fewer requests, then chance (spreads a cold start).
            scored.append(
                (wait, -blocks, self._board.requests(replica), self._rng.random(), replica)
            )
        wait, neg_blocks, _, _, replica = min(scored)
        if job.chain and not matches:
            replica, wait = self._spread(job, scored)
        best_match = max(matches.values(), default=0)
        reason = REASON_AFFINITY if best_match and -neg_blocks == best_match else REASON_LOAD
        choice = Choice(replica, reason, -neg_blocks, self._work(job, -neg_blocks), wait)
        return self._balance(job, pool, choice, matches)

    def _spread(
        self, job: Job, scored: list[tuple[float, int, int, float, str]]
    ) -> tuple[str, float]:
        # A prefix no replica holds yet: among replicas whose wait is within this request's
        # own work of the best, take the one remembering the fewest blocks (SGLang's "smallest
        # tree"), so prefixes spread over the replicas' KV memory instead of piling up.
        best = min(wait for wait, *_ in scored)
        slack = self._work(job, 0) / max(self._board.capacity(r) for *_, r in scored)
        near = [(wait, r) for wait, *_, r in scored if wait <= best + slack]
        wait, replica = min(near, key=lambda item: (self._affinity.footprint(item[1]), item[0]))
        return replica, wait

    def _balance(
        self, job: Job, pool: Sequence[str], choice: Choice, matches: dict[str, int]
    ) -> Choice:
        loads = {r: self._board.requests(r) for r in pool}
        low, high = min(loads.values()), max(loads.values())
        imbalanced = (
            high - low > self._settings.imbalance_abs and high > low * self._settings.imbalance_rel
        )
        if not imbalanced or loads[choice.replica] == low:
            return choice
        replica = min(pool, key=lambda r: (loads[r], -matches.get(r, 0)))
        blocks = matches.get(replica, 0)
        work = self._work(job, blocks)
        return Choice(replica, REASON_IMBALANCE, blocks, work, self._wait(replica, work))

    def _work(self, job: Job, cached_blocks: int) -> float:
        # The engine always recomputes at least the prompt's last token.
        cached = min(cached_blocks * self._settings.block_tokens, max(job.prompt_tokens - 1, 0))
        return self._settings.prefill_weight * (job.prompt_tokens - cached) + job.max_tokens

    def _wait(self, replica: str, work: float) -> float:
        queued = self._board.queued_work(replica, self._settings.prefill_weight)
        return (queued + work) / self._board.capacity(replica)


def _with_reason(choice: Choice, reason: str) -> Choice:
    return Choice(choice.replica, reason, choice.cached_blocks, choice.work, choice.expected_wait)
