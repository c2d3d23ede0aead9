"""Per-step token masks for sequences decoding under a grammar (constrained decoding).

Each constrained Sequence carries an xgrammar GrammarMatcher (`seq.grammar`) that has accepted
every token it generated so far. Preemption keeps generated tokens, so the matcher stays valid
across recompute; prefill chunks that do not sample never touch it.

Per step: fill one reused CPU bitmask (only the rows of constrained sequences), apply it to the
logits in place before the sampler, and after sampling feed each chosen token to its matcher.
The matcher allows EOS only where the grammar accepts the output, and only EOS once nothing can
follow, so a finished grammar ends the request with STOP. When the sampler's own rules
(min_tokens banning EOS, penalties) leave no token the grammar allows, the grammar wins: the
most likely allowed token replaces the sample.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .sequence import Sequence

if TYPE_CHECKING:
    import xgrammar as xgr

    from .grammar import CompiledFormat

log = logging.getLogger(__name__)

RECENT_STEPS = 1024


@dataclass(slots=True)
class GrammarStats:
    """Cheap counters the service can export: recent per-step mask times and overrides."""

    mask_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_STEPS))
    masked_rows: int = 0  # rows masked so far
    overridden: int = 0  # samples the grammar rejected and replaced


def new_matcher(compiled: CompiledFormat) -> xgr.GrammarMatcher:
    """A fresh matcher for one request (its state: the tokens generated so far)."""
    import xgrammar as xgr

    return xgr.GrammarMatcher(compiled.grammar)


class GrammarMasker:
    """Applies the constrained rows' masks to a step's logits and advances their matchers."""

    def __init__(self, vocab_size: int, max_rows: int) -> None:
        self.vocab_size = vocab_size
        self.max_rows = max_rows
        self.stats = GrammarStats()
        self._bitmask: torch.Tensor | None = None  # allocated on first use, then reused

    def apply(self, logits: torch.Tensor, seqs: Seq[Sequence]) -> list[int]:
        """Mask the rows of constrained sequences in place; returns those rows."""
        rows = [i for i, seq in enumerate(seqs) if seq.grammar is not None]
        if not rows:
            return rows
        import xgrammar as xgr

        start = time.perf_counter()
        bitmask = self._rows(len(seqs))
        masked = [i for i in rows if _fill(seqs[i], bitmask, i)]
        if masked:
            if logits.device.type == "cpu":
                xgr.apply_token_bitmask_inplace(logits, bitmask, indices=masked)
            else:
                on_device = bitmask[: len(seqs)].to(logits.device, non_blocking=True)
                xgr.apply_token_bitmask_inplace(
                    logits, on_device, indices=masked, backend="torch_native"
                )
        self.stats.mask_ms.append((time.perf_counter() - start) * 1e3)
        self.stats.masked_rows += len(masked)
        return rows

    def accept(
        self, seqs: Seq[Sequence], token_ids: list[int], logits: torch.Tensor, rows: Seq[int]
    ) -> None:
        """Advance each constrained row's matcher by its sampled token (replaced when the
        grammar rejects it: see the module docstring)."""
        for row in rows:
            matcher = seqs[row].grammar
            assert matcher is not None
            if matcher.accept_token(token_ids[row]):
                continue
            replacement = self._allowed_choice(logits[row], row)
            log.warning(
                "grammar rejected token %d of %s; using %d",
                token_ids[row],
                seqs[row].request_id,
                replacement,
            )
            self.stats.overridden += 1
            token_ids[row] = replacement
            matcher.accept_token(replacement)

    def _rows(self, count: int) -> torch.Tensor:
        import xgrammar as xgr

        if self._bitmask is None or self._bitmask.shape[0] < count:
            self._bitmask = xgr.allocate_token_bitmask(max(count, self.max_rows), self.vocab_size)
        return self._bitmask

    def _allowed_choice(self, row_logits: torch.Tensor, row: int) -> int:
        """The most likely token this row's bitmask allows (the first allowed if all -inf)."""
        assert self._bitmask is not None
        allowed = unpack_bitmask(self._bitmask[row], self.vocab_size)
        scores = row_logits.float().cpu()[: self.vocab_size].masked_fill(~allowed, float("-inf"))
        best = int(scores.argmax())
        if allowed[best]:
            return best
        first = allowed.nonzero()
        return int(first[0, 0]) if first.numel() else best


def unpack_bitmask(packed: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """One bitmask row (int32 words, bit j of word w = token 32w + j) as a bool vector."""
    shifts = torch.arange(32, dtype=torch.int32)
    bits = (packed[:, None] >> shifts) & 1
    return bits.flatten()[:vocab_size].bool()


def _fill(seq: Sequence, bitmask: torch.Tensor, row: int) -> bool:
    """Fill one row; False when the grammar allows every token (nothing to apply)."""
    matcher = seq.grammar
    assert matcher is not None
    return bool(matcher.fill_next_token_bitmask(bitmask, row))
