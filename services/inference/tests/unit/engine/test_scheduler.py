"""Scheduler: token budget, chunked prefill, mixed steps, priority, preemption, cancellation."""

from __future__ import annotations

from llm_inference.engine.api import SamplingOptions
from llm_inference.engine.block_manager import BlockManager
from llm_inference.engine.scheduler import Scheduler, SchedulerOutput
from llm_inference.engine.sequence import Sequence, SequenceStatus

BS = 4
_arrivals = iter(range(1_000_000))


def _seq(rid: str, prompt_len: int, priority: int = 0, first: int = 0) -> Sequence:
    tokens = [first + i for i in range(prompt_len)]
    return Sequence(
        rid, tokens, prompt_len, SamplingOptions(), 64, priority, arrival_index=next(_arrivals)
    )


def _scheduler(blocks: int = 64, max_seqs: int = 8, budget: int = 32) -> Scheduler:
    return Scheduler(BlockManager(blocks, BS, enable_prefix_caching=True), max_seqs, budget)


def _complete(scheduler: Scheduler, output: SchedulerOutput, token: int = 7) -> None:
    """What the engine does after a step: advance progress, append a token where one is due."""
    for chunk in output.chunks:
        chunk.seq.num_computed_tokens = chunk.end
        scheduler.block_manager.cache_full_blocks(chunk.seq)
        if chunk.samples:
            chunk.seq.token_ids.append(token)


def _plan(output: SchedulerOutput) -> dict[str, int]:
    return {c.seq.request_id: c.num_tokens for c in output.chunks}


def test_token_budget_chunks_a_long_prompt() -> None:
    scheduler = _scheduler(budget=10)
    seq = _seq("a", 25)
    scheduler.add(seq)
    chunks = []
    while seq.num_completion_tokens == 0:
        output = scheduler.schedule()
        assert output.num_tokens <= 10
        chunks.append(_plan(output)["a"])
        _complete(scheduler, output)
    assert chunks == [10, 10, 5]


def test_prefill_and_decode_share_a_step() -> None:
    scheduler = _scheduler(budget=16)
    first = _seq("a", 6)
    scheduler.add(first)
    _complete(scheduler, scheduler.schedule())  # a is now decoding
    scheduler.add(_seq("b", 40))
    output = scheduler.schedule()
    assert _plan(output) == {"a": 1, "b": 15}  # decode first, the rest of the budget prefills


def test_max_num_seqs_limits_admission() -> None:
    scheduler = _scheduler(max_seqs=2, budget=100)
    for i, rid in enumerate("abc"):
        scheduler.add(_seq(rid, 5, first=100 * i))
    assert set(_plan(scheduler.schedule())) == {"a", "b"}
    assert [s.request_id for s in scheduler.waiting] == ["c"]


def test_higher_priority_is_admitted_first_then_fcfs() -> None:
    scheduler = _scheduler(max_seqs=1, budget=100)
    scheduler.add(_seq("low-old", 5, priority=0))
    scheduler.add(_seq("high", 5, priority=5, first=100))
    scheduler.add(_seq("low-new", 5, priority=0, first=200))
    order = []
    while scheduler.has_work:
        output = scheduler.schedule()
        _complete(scheduler, output)
        for chunk in output.chunks:
            if chunk.seq.request_id not in order:
                order.append(chunk.seq.request_id)
            scheduler.finish(chunk.seq)  # one token each is enough here
    assert order == ["high", "low-old", "low-new"]


def test_preemption_evicts_the_newest_lowest_priority_and_requeues_it_first() -> None:
    scheduler = _scheduler(blocks=6, budget=100)
    a, b = _seq("a", 8), _seq("b", 8, first=100)  # 2 blocks each, 2 blocks left
    scheduler.add(a)
    scheduler.add(b)
    _complete(scheduler, scheduler.schedule())  # both prefilled; each now holds 9 tokens
    for _ in range(3):  # grow until a third block each no longer fits
        output = scheduler.schedule()
        _complete(scheduler, output)
    assert scheduler.num_preemptions == 0
    for _ in range(4):
        output = scheduler.schedule()
        if output.preempted:
            break
        _complete(scheduler, output)
    assert [s.request_id for s in output.preempted] == ["b"]
    assert b.status is SequenceStatus.WAITING
    assert b.num_computed_tokens == 0
    assert b.block_table == []
    assert scheduler.waiting[0] is b
    assert _plan(output) == {"a": 1}  # no admissions in a step that preempted


def test_preempted_sequence_recomputes_prompt_and_generated_tokens() -> None:
    scheduler = _scheduler(blocks=5, budget=100)
    a, b = _seq("a", 8), _seq("b", 7, first=50)
    scheduler.add(a)
    scheduler.add(b)
    for _ in range(20):
        output = scheduler.schedule()
        if output.preempted:
            break
        _complete(scheduler, output)
    assert [s.request_id for s in output.preempted] == ["b"]
    generated = b.num_completion_tokens
    assert generated > 0
    scheduler.finish(a)
    output = scheduler.schedule()
    # Its own freed blocks are still cached: only the uncached tail is recomputed.
    assert b.num_computed_tokens > 0
    assert _plan(output)["b"] == b.num_tokens - b.num_computed_tokens
    assert b.num_completion_tokens == generated  # recompute keeps what was generated


def test_finish_frees_blocks_at_once_for_running_and_waiting() -> None:
    scheduler = _scheduler(blocks=16, max_seqs=1)
    running, waiting = _seq("r", 9), _seq("w", 9)
    scheduler.add(running)
    scheduler.add(waiting)
    _complete(scheduler, scheduler.schedule())
    manager = scheduler.block_manager
    assert manager.num_free_blocks == 16 - 3
    scheduler.finish(running)
    assert manager.num_free_blocks == 16
    assert running.status is SequenceStatus.FINISHED
    scheduler.finish(waiting)
    assert not scheduler.has_work
    scheduler.finish(waiting)  # idempotent


def test_prefix_hit_is_reported_once_and_skips_cached_tokens() -> None:
    scheduler = _scheduler(budget=100)
    scheduler.add(_seq("a", 12))
    output = scheduler.schedule()
    _complete(scheduler, output)
    scheduler.finish(output.chunks[0].seq)
    again = _seq("b", 14)
    scheduler.add(again)
    output = scheduler.schedule()
    assert again.num_cached_tokens == 12  # 3 full blocks of the same first 12 tokens
    assert _plan(output) == {"b": 2}


def test_a_prefix_being_computed_is_waited_for_not_recomputed() -> None:
    scheduler = _scheduler(budget=12)
    first, second = _seq("a", 20), _seq("b", 22)  # same first 20 tokens
    other = _seq("c", 6, first=500)
    for seq in (first, second, other):
        scheduler.add(seq)
    output = scheduler.schedule()
    # b would recompute a's blocks: it waits, and the unrelated c takes the budget instead.
    assert _plan(output) == {"a": 12}
    assert scheduler.waiting[0] is second
    _complete(scheduler, output)
    output = scheduler.schedule()
    assert _plan(output) == {"a": 8, "c": 4}
    _complete(scheduler, output)
    output = scheduler.schedule()
    assert second.num_cached_tokens == 20  # all five of a's blocks
    assert _plan(output)["b"] == 2
