"""Token-budget scheduler: chunked prefill, mixed prefill and decode, priority FCFS, preemption."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from .block_manager import BlockManager
from .sequence import Sequence, SequenceStatus


@dataclass(frozen=True, slots=True)
class ScheduledChunk:
    """`num_tokens` tokens of `seq` starting at `start` (its computed count when scheduled)."""

    seq: Sequence
    start: int
    num_tokens: int  # draft tokens included
    num_draft: int = 0  # trailing tokens from seq.draft_ids (speculative decoding)

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def samples(self) -> bool:
        """The chunk reaches the sequence's last token, so its logits yield a new token."""
        return self.end - self.num_draft == self.seq.num_tokens

    def token_ids(self) -> list[int]:
        tokens = self.seq.token_ids[self.start : self.end - self.num_draft]
        return tokens + self.seq.draft_ids[: self.num_draft]


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    """The work of one step."""

    chunks: tuple[ScheduledChunk, ...]
    preempted: tuple[Sequence, ...]

    @property
    def num_tokens(self) -> int:
        return sum(chunk.num_tokens for chunk in self.chunks)

    @property
    def is_empty(self) -> bool:
        return not self.chunks


class Scheduler:
    """Decides which tokens of which sequences run in each step.

    Running sequences are served first (highest priority, then oldest), each taking
    `num_tokens - num_computed_tokens` tokens capped by what is left of the step's token budget;
    when KV blocks run out the lowest-priority newest running sequence is preempted (blocks freed,
    recomputed later). Waiting sequences are admitted in the same order while budget, the
    sequence limit and blocks allow, and only in steps that preempted nothing. A waiting
    sequence whose next uncached block is being computed by a running prefill waits a step
    instead of computing the same prefix again (a burst of prompts sharing a system prompt
    computes it once).
    """

    def __init__(
        self, block_manager: BlockManager, max_num_seqs: int, max_batched_tokens: int
    ) -> None:
        self.block_manager = block_manager
        self.max_num_seqs = max_num_seqs
        self.max_batched_tokens = max_batched_tokens
        self.waiting: list[Sequence] = []  # sorted by schedule_key
        self.running: list[Sequence] = []  # sorted by schedule_key
        self._by_id: dict[str, Sequence] = {}
        self.num_preemptions = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def get(self, request_id: str) -> Sequence | None:
        return self._by_id.get(request_id)

    def add(self, seq: Sequence) -> None:
        if seq.request_id in self._by_id:
            raise ValueError(f"request {seq.request_id!r} is already scheduled")
        seq.status = SequenceStatus.WAITING
        self._by_id[seq.request_id] = seq
        _insert(self.waiting, seq)

    def finish(self, seq: Sequence) -> None:
        """Remove a sequence (finished, cancelled or failed) and free its blocks at once."""
        if self._by_id.pop(seq.request_id, None) is None:
            return
        if seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.block_manager.free(seq)
        seq.status = SequenceStatus.FINISHED

    def schedule(self) -> SchedulerOutput:
        budget = self.max_batched_tokens
        chunks: list[ScheduledChunk] = []
        preempted: list[Sequence] = []
        index = 0
        while index < len(self.running) and budget > 0:
            seq = self.running[index]
            num = min(seq.num_uncomputed_tokens, budget)
            draft = min(len(seq.draft_ids), budget - 1) if num == 1 else 0
            if not self._reserve(seq, num + draft, preempted):
                break  # seq itself was preempted; everything after it already was
            chunks.append(ScheduledChunk(seq, seq.num_computed_tokens, num + draft, draft))
            budget -= num + draft
            index += 1
        if not preempted:
            budget = self._admit(chunks, budget)
        return SchedulerOutput(tuple(chunks), tuple(preempted))

    def _reserve(self, seq: Sequence, num: int, preempted: list[Sequence]) -> bool:
        """Make room for `num` more tokens of a running seq, preempting from the tail as needed."""
        target = seq.num_computed_tokens + num
        while not self.block_manager.can_grow(seq, target):
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        self.block_manager.grow(seq, target)
        return True

    def _admit(self, chunks: list[ScheduledChunk], budget: int) -> int:
        manager = self.block_manager
        in_flight = self._in_flight_blocks()
        deferred: list[Sequence] = []
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.waiting.pop(0)
            hit = manager.lookup(seq)
            if self._next_block_in_flight(seq, hit.num_blocks, in_flight):
                deferred.append(seq)  # a running prefill is computing the same prefix: wait
                continue
            cached = hit.num_blocks * manager.block_size
            num = min(seq.num_tokens - cached, budget)
            if not manager.can_admit(hit, cached + num):
                self.waiting.insert(0, seq)
                break
            manager.admit(seq, hit, cached + num)
            if not seq.admitted_once:
                seq.admitted_once = True
                seq.num_cached_tokens = cached
                manager.record_query(seq.num_prompt_tokens, cached)
            seq.status = SequenceStatus.RUNNING
            _insert(self.running, seq)
            chunks.append(ScheduledChunk(seq, cached, num))
            budget -= num
            in_flight |= self._uncomputed_blocks(seq)
        self.waiting[:0] = deferred
        return budget

    def _in_flight_blocks(self) -> set[int]:
        """Hashes of full blocks that running prefills have yet to compute."""
        if not self.block_manager.enable_prefix_caching:
            return set()
        blocks: set[int] = set()
        for seq in self.running:
            if seq.num_uncomputed_tokens > 1:
                blocks |= self._uncomputed_blocks(seq)
        return blocks

    def _uncomputed_blocks(self, seq: Sequence) -> set[int]:
        if not self.block_manager.enable_prefix_caching:
            return set()
        size = self.block_manager.block_size
        full = seq.num_tokens // size
        hashes = self.block_manager.block_hashes(seq, full)
        return set(hashes[seq.num_computed_tokens // size : full])

    def _next_block_in_flight(self, seq: Sequence, hit_blocks: int, in_flight: set[int]) -> bool:
        if not in_flight:
            return False
        full = (seq.num_tokens - 1) // self.block_manager.block_size
        if hit_blocks >= full:
            return False
        return self.block_manager.block_hashes(seq, full)[hit_blocks] in in_flight

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.block_manager.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        self.num_preemptions += 1
        _insert(self.waiting, seq)  # keeps its arrival index, so it goes ahead of later arrivals


def _insert(queue: list[Sequence], seq: Sequence) -> None:
    keys = [s.schedule_key for s in queue]
    queue.insert(bisect.bisect_right(keys, seq.schedule_key), seq)
