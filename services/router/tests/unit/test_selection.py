"""Replica selection: expected-wait argmin, prefix affinity, imbalance override, exclusion."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from llm_router.routing.load import LoadBoard, LoadSnapshot
from llm_router.routing.prefix import AffinityTable
from llm_router.routing.selection import (
    REASON_AFFINITY,
    REASON_IMBALANCE,
    REASON_LOAD,
    REASON_ROUND_ROBIN,
    REASON_UNKNOWN,
    Job,
    ReplicaSelector,
)
from llm_router.routing.settings import RoutingSettings

from .conftest import ManualClock

REPLICAS = ["a:1", "b:1", "c:1"]
SETTINGS = RoutingSettings(
    block_tokens=16, max_prefix_blocks=64, imbalance_abs=4, imbalance_rel=1.5
)


def make(
    clock: ManualClock, settings: RoutingSettings = SETTINGS
) -> tuple[ReplicaSelector, LoadBoard]:
    board = LoadBoard(exclude_s=5, exclude_max_s=60, stale_s=5, clock=clock)
    affinity = AffinityTable(max_entries=10_000, ttl_s=600, clock=clock)
    return ReplicaSelector(board, affinity, settings, random.Random(3)), board


def job(selector: ReplicaSelector, tokens: list[int], max_tokens: int = 16) -> Job:
    return Job("dep", selector.chain("dep", tokens), len(tokens), max_tokens)


def report(board: LoadBoard, replica: str, **kw: int) -> None:
    board.report(replica, LoadSnapshot(max_num_seqs=kw.pop("max_num_seqs", 8), **kw))


def test_picks_the_least_expected_wait(clock: ManualClock) -> None:
    selector, board = make(clock)
    report(board, "a:1", running_remaining_tokens=400, num_running=4)
    report(board, "b:1", running_remaining_tokens=100, num_running=1)
    report(board, "c:1", running_remaining_tokens=300, num_running=3)
    choice = selector.choose(job(selector, [1] * 10), REPLICAS)
    assert choice is not None
    assert (choice.replica, choice.reason) == ("b:1", REASON_LOAD)
    assert choice.expected_wait == pytest.approx((100 + 10 + 16) / 8)


def test_capacity_divides_the_wait(clock: ManualClock) -> None:
    selector, board = make(clock)
    report(board, "a:1", running_remaining_tokens=400, max_num_seqs=64)
    report(board, "b:1", running_remaining_tokens=100, max_num_seqs=4)
    choice = selector.choose(job(selector, [1] * 10), REPLICAS[:2])
    assert choice is not None
    assert choice.replica == "a:1"


def test_repeated_prefixes_land_on_the_same_replica(clock: ManualClock) -> None:
    selector, board = make(clock)
    for r in REPLICAS:
        report(board, r)
    prefixes = [[p] * 256 for p in range(6)]
    homes: dict[int, str] = {}
    for round_ in range(4):
        for p, prefix in enumerate(prefixes):
            j = job(selector, [*prefix, 1000 + round_])
            choice = selector.choose(j, REPLICAS)
            assert choice is not None
            selector.record(j, choice.replica)
            if round_ == 0:
                homes[p] = choice.replica
                # Spread the cold prefixes: this replica is now busier.
                board.begin(choice.replica, choice.work)
            else:
                assert choice.replica == homes[p]
                assert choice.reason == REASON_AFFINITY
                assert choice.cached_blocks == 16
    assert len(set(homes.values())) == 3  # cold prefixes were spread by load


def test_affinity_loses_when_the_warm_queue_costs_more_than_the_prefill(
    clock: ManualClock,
) -> None:
    selector, board = make(clock)
    report(board, "a:1")
    report(board, "b:1")
    warm = job(selector, [5] * 64)
    selector.record(warm, "a:1")
    assert selector.choose(warm, ["a:1", "b:1"]).replica == "a:1"  # type: ignore[union-attr]
    report(board, "a:1", running_remaining_tokens=8 * 200)  # 200 tokens/slot ahead > 63 saved
    choice = selector.choose(warm, ["a:1", "b:1"])
    assert choice is not None
    assert (choice.replica, choice.reason) == ("b:1", REASON_LOAD)


def test_imbalance_overrides_affinity(clock: ManualClock) -> None:
    settings = replace(SETTINGS, prefill_weight=100.0)  # affinity alone would always win
    selector, board = make(clock, settings)
    report(board, "a:1", num_running=10, running_remaining_tokens=10)
    report(board, "b:1", num_running=1, running_remaining_tokens=1)
    warm = job(selector, [5] * 64)
    selector.record(warm, "a:1")
    choice = selector.choose(warm, ["a:1", "b:1"])
    assert choice is not None
    assert (choice.replica, choice.reason) == ("b:1", REASON_IMBALANCE)
    report(board, "a:1", num_running=4, running_remaining_tokens=10)  # within abs threshold
    choice = selector.choose(warm, ["a:1", "b:1"])
    assert choice is not None
    assert (choice.replica, choice.reason) == ("a:1", REASON_AFFINITY)


def test_excluded_and_failed_replicas_are_skipped(clock: ManualClock) -> None:
    selector, board = make(clock)
    for r in REPLICAS:
        report(board, r)
    board.fail("a:1")
    picks = {
        selector.choose(job(selector, [i] * 3), REPLICAS, exclude={"b:1"}).replica
        for i in range(20)
    }  # type: ignore[union-attr]
    assert picks == {"c:1"}
    board.fail("c:1")
    assert selector.choose(job(selector, [1]), REPLICAS, exclude={"b:1"}) is None
    clock.advance(5.1)
    for r in REPLICAS:
        report(board, r)
    assert selector.choose(job(selector, [1]), REPLICAS, exclude={"b:1"}) is not None


def test_fresh_reports_are_preferred_over_unknown_load(clock: ManualClock) -> None:
    selector, board = make(clock)
    report(board, "b:1", running_remaining_tokens=10_000)
    choice = selector.choose(job(selector, [1]), REPLICAS)
    assert choice is not None
    assert choice.replica == "b:1"
    unknown_only = selector.choose(job(selector, [1]), ["a:1", "c:1"])
    assert unknown_only is not None
    assert unknown_only.reason == REASON_UNKNOWN


def test_round_robin_baseline_rotates(clock: ManualClock) -> None:
    selector, board = make(clock, replace(SETTINGS, balancer="round_robin"))
    for r in REPLICAS:
        report(board, r)
    j = job(selector, [1] * 64)
    assert j.chain == ()
    picks = [selector.choose(j, REPLICAS) for _ in range(6)]
    assert [p.replica for p in picks if p] == REPLICAS * 2
    assert {p.reason for p in picks if p} == {REASON_ROUND_ROBIN}


def test_cold_start_spreads_by_chance(clock: ManualClock) -> None:
    selector, board = make(clock)
    for r in REPLICAS:
        report(board, r)
    counts = Counter(selector.choose(job(selector, [i]), REPLICAS).replica for i in range(300))  # type: ignore[union-attr]
    assert set(counts) == set(REPLICAS)


def test_cold_prefixes_spread_by_cache_footprint(clock: ManualClock) -> None:
    selector, board = make(clock)
    report(board, "a:1", running_remaining_tokens=8)  # slightly busier ...
    report(board, "b:1")
    for p in range(3):  # ... but b already holds three prefixes, a none
        warm = job(selector, [100 + p] * 64)
        selector.record(warm, "b:1")
    cold = job(selector, [7] * 64)
    choice = selector.choose(cold, ["a:1", "b:1"])
    assert choice is not None
    assert (choice.replica, choice.reason) == ("a:1", REASON_LOAD)
    # A much busier replica is not chosen just for its small footprint.
    report(board, "a:1", running_remaining_tokens=8 * 500)
    choice = selector.choose(cold, ["a:1", "b:1"])
    assert choice is not None
    assert choice.replica == "b:1"


def test_footprint_follows_records_evictions_and_forget(clock: ManualClock) -> None:
    table = AffinityTable(max_entries=4, ttl_s=60, clock=clock)
    selector = ReplicaSelector(
        LoadBoard(exclude_s=1, exclude_max_s=1, stale_s=1, clock=clock), table, SETTINGS
    )
    first = job(selector, [1] * 48)  # 3 blocks
    table.record(first.chain, "a:1")
    assert table.footprint("a:1") == 3
    table.record(first.chain[:2], "b:1")  # two blocks move to b
    assert (table.footprint("a:1"), table.footprint("b:1")) == (1, 2)
    table.record(job(selector, [2] * 32).chain, "b:1")  # 2 more: one entry evicted (a's)
    assert (table.footprint("a:1"), table.footprint("b:1")) == (0, 4)
    table.forget("b:1")
    assert table.footprint("b:1") == 0
    assert len(table) == 0
