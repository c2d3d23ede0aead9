"""Sequence: the scheduler's view of one request (tokens, progress, KV blocks, priority)."""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .api import FinishReason, SamplingOptions

if TYPE_CHECKING:
    from xgrammar import GrammarMatcher


class SequenceStatus(enum.Enum):
    """Where a sequence is in its lifecycle."""

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(slots=True, eq=False)
class Sequence:
    """Token ids (prompt then generated) and how many of them have KV computed.

    The scheduler's one rule: a sequence needs `num_tokens - num_computed_tokens` more tokens of
    compute; that covers prefill, chunked prefill, prefix-cache hits, recompute after preemption
    and decode (1 token).
    """

    request_id: str
    token_ids: list[int]
    num_prompt_tokens: int
    sampling: SamplingOptions
    max_completion_tokens: int  # sampling.max_tokens capped by the context length
    priority: int = 0
    arrival_index: int = 0
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache at first admission
    block_table: list[int] = field(default_factory=list)
    # Chained hashes of the full blocks of token_ids, extended lazily (tokens only grow).
    block_hashes: list[int] = field(default_factory=list)
    num_registered_blocks: int = 0  # leading blocks already offered to the prefix cache
    num_preemptions: int = 0
    admitted_once: bool = False
    finish_reason: FinishReason | None = None
    # Constrained decoding: has accepted every generated token (kept across preemption).
    grammar: GrammarMatcher | None = None
    # Speculative decoding: tokens proposed to follow token_ids this step (never in token_ids).
    draft_ids: list[int] = field(default_factory=list)
    # Its adaptive draft length (0 until the first verification): grows while drafts are
    # accepted whole, shrinks to what was accepted, so rejected rows stop costing compute.
    draft_limit: int = 0
    # Generated-token occurrences for the penalties, caught up lazily from token_ids (which
    # only grow), so every appender is covered and each token is counted once.
    _output_counts: Counter[int] = field(default_factory=Counter, init=False, repr=False)
    _num_counted: int = field(default=0, init=False, repr=False)
    _distinct_prompt_ids: torch.Tensor | None = field(default=None, init=False, repr=False)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_completion_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def schedule_key(self) -> tuple[int, int]:
        """Sort key: higher priority first, then first come first served."""
        return (-self.priority, self.arrival_index)

    @property
    def is_finished(self) -> bool:
        return self.status is SequenceStatus.FINISHED

    def output_counts(self) -> Counter[int]:
        """How often each token id was generated so far (prompt excluded); do not mutate."""
        start = max(self._num_counted, self.num_prompt_tokens)
        if start < len(self.token_ids):
            self._output_counts.update(self.token_ids[start:])
        self._num_counted = len(self.token_ids)
        return self._output_counts

    def distinct_prompt_ids(self) -> torch.Tensor:
        """The prompt's distinct token ids (a CPU tensor built once; for the repetition penalty)."""
        if self._distinct_prompt_ids is None:
            distinct = set(self.token_ids[: self.num_prompt_tokens])
            self._distinct_prompt_ids = torch.tensor(sorted(distinct), dtype=torch.long)
        return self._distinct_prompt_ids
