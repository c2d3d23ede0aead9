"""LoadBoard bookkeeping and the prefix-affinity table."""

from __future__ import annotations

import pytest

from llm_router.routing.load import Health, LoadBoard, LoadSnapshot
from llm_router.routing.prefix import AffinityTable, prefix_chain

from .conftest import ManualClock


def board(clock: ManualClock) -> LoadBoard:
    return LoadBoard(exclude_s=2.0, exclude_max_s=10.0, stale_s=1.0, clock=clock)


def test_health_follows_reports_and_staleness(clock: ManualClock) -> None:
    b = board(clock)
    assert b.health("r") == Health.UNKNOWN
    b.report("r", LoadSnapshot(max_num_seqs=8))
    assert b.health("r") == Health.FRESH
    assert b.capacity("r") == 8
    clock.advance(1.5)
    assert b.health("r") == Health.UNKNOWN
    b.report("r", LoadSnapshot())
    b.lost("r")
    assert b.health("r") == Health.UNKNOWN


def test_exclusion_doubles_and_ends(clock: ManualClock) -> None:
    b = board(clock)
    assert b.fail("r") == 2.0
    assert b.health("r") == Health.EXCLUDED
    assert b.retry_after(["r"]) == pytest.approx(2.0)
    clock.advance(2.01)
    assert b.health("r") != Health.EXCLUDED
    assert b.fail("r") == 4.0
    assert b.fail("r") == 8.0
    assert b.fail("r") == 10.0  # capped
    b.succeed("r")
    assert b.health("r") != Health.EXCLUDED
    assert b.fail("r") == 2.0  # the streak restarted
    assert b.retry_after(["r", "other"]) == 0.0


def test_queued_work_counts_own_requests_sent_after_the_report(clock: ManualClock) -> None:
    b = board(clock)
    early = b.begin("r", 100.0)
    clock.advance(0.1)
    b.report(
        "r", LoadSnapshot(waiting_prompt_tokens=40, running_remaining_tokens=60, num_running=1)
    )
    # The early request is in the report's numbers; only the later one is added.
    clock.advance(0.1)
    late = b.begin("r", 30.0)
    assert b.queued_work("r", prefill_weight=0.5) == pytest.approx(0.5 * 40 + 60 + 30)
    assert b.requests("r") == 2
    b.finish(late)
    b.finish(late)  # idempotent
    b.finish(early)
    assert b.queued_work("r", prefill_weight=0.5) == pytest.approx(80)
    # Unknown load: only this router's own requests count.
    clock.advance(5)
    b.begin("r", 7.0)
    assert b.queued_work("r", prefill_weight=1.0) == 7.0


def test_a_prefilled_request_counts_only_the_tokens_left(clock: ManualClock) -> None:
    b = board(clock)
    first = b.begin("r", 119.0)  # 113 prompt tokens + 6 to generate, none reported yet
    b.prefilled(first, 6.0)
    assert b.queued_work("r", prefill_weight=1.0) == 6.0
    assert b.requests("r") == 1
    b.finish(first)
    b.prefilled(first, 3.0)  # a finished ticket stays finished
    assert b.queued_work("r", prefill_weight=1.0) == 0.0
    assert b.requests("r") == 0


def test_prefix_chain_hashes_full_blocks_only() -> None:
    tokens = list(range(40))
    chain = prefix_chain(tokens, block_tokens=16, max_blocks=8, salt="d")
    assert len(chain) == 2
    same_start = prefix_chain(tokens[:32] + [999] * 8, block_tokens=16, max_blocks=8, salt="d")
    assert same_start == chain
    other_second = prefix_chain(tokens[:16] + [7] * 16, block_tokens=16, max_blocks=8, salt="d")
    assert other_second[0] == chain[0]
    assert other_second[1] != chain[1]
    assert prefix_chain(tokens, block_tokens=16, max_blocks=1, salt="d") == chain[:1]
    assert prefix_chain(tokens, block_tokens=16, max_blocks=8, salt="e") != chain
    assert prefix_chain(tokens[:15], block_tokens=16, max_blocks=8, salt="d") == ()


def test_affinity_finds_each_replicas_deepest_match(clock: ManualClock) -> None:
    table = AffinityTable(max_entries=100, ttl_s=60, clock=clock)
    a = prefix_chain(list(range(64)), block_tokens=16, max_blocks=8, salt="d")
    table.record(a[:2], "r1")
    table.record(a, "r2")  # a later request with the same start went to r2
    table.record(a[:1], "r1")
    assert table.matches(a, ["r1", "r2", "r3"]) == {"r2": 4, "r1": 1}
    assert table.matches(a, ["r3"]) == {}
    clock.advance(61)
    assert table.matches(a, ["r1", "r2"]) == {}


def test_affinity_is_bounded_and_forgets_replicas(clock: ManualClock) -> None:
    table = AffinityTable(max_entries=3, ttl_s=60, clock=clock)
    chain = prefix_chain(list(range(80)), block_tokens=16, max_blocks=8, salt="d")
    table.record(chain, "r1")
    assert len(table) == 3
    assert table.matches(chain, ["r1"]) == {"r1": 5}
    assert table.matches(chain[:2], ["r1"]) == {}  # the oldest blocks were evicted
    table.forget("r1")
    assert len(table) == 0
