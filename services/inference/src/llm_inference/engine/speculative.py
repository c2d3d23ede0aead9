"""Speculative decoding by prompt lookup: n-gram drafts from the sequence itself, greedy verify.

No draft model: the last n tokens (n from ngram_max down to ngram_min) are looked up earlier in
the prompt and output; the tokens that followed the most recent match are the draft. The
scheduler runs the last token plus the draft as one chunk (K/V written into the paged cache,
logits at every position); the longest draft prefix that equals the model's greedy choices is
accepted, plus the model's own next token. Each sequence's draft length adapts
(next_draft_limit): two longer after a fully accepted draft, cut to what was accepted plus
one after a rejection, so text that is not being copied stops paying for long drafts.
Rejected positions' K/V stay in slots past num_computed_tokens and are overwritten by the
next step, so nothing is rolled back but the count. Output is the greedy output token for
token: every emitted token is an argmax.

Only greedy rows whose logits need no history-dependent processing are drafted for (no
penalties, bias, min_tokens, logprobs or output format), and only while the decode batch is
small: at large batches a CPU step is compute-bound and verifying drafts costs more than it saves.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass, field

import numpy as np

from .api import SamplingOptions
from .penalties import needs_adjusting
from .sequence import Sequence


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """num_tokens 0 turns speculation off."""

    num_tokens: int = 0  # longest draft per step (each sequence adapts below it)
    ngram_max: int = 3
    ngram_min: int = 1
    max_batch: int = 8  # draft only while at most this many sequences are decoding


@dataclass(slots=True)
class SpeculativeStats:
    """Counters since start (Prometheus counters read them at scrape time)."""

    steps: int = 0  # verifications run (one per drafted sequence and step)
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens the model agreed with
    emitted: int = 0  # tokens those verifications produced (accepted + one per verification)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens per verification: 1.0 means speculation gained nothing."""
        return self.emitted / self.steps if self.steps else 0.0


@dataclass(slots=True)
class Verdict:
    """The tokens one verification emits (all greedy choices) and how many drafts were right."""

    tokens: list[int] = field(default_factory=list)
    accepted: int = 0


def eligible(options: SamplingOptions, has_grammar: bool) -> bool:
    """Whether a request's output is unchanged by speculation (greedy, history-free logits)."""
    return (
        options.speculative
        and options.temperature == 0.0
        and not options.logprobs
        and options.top_logprobs == 0
        and not needs_adjusting(options)
        and not has_grammar
    )


def propose(tokens: Seq[int], k: int, ngram_max: int, ngram_min: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier match of the last n tokens, for the
    largest n in [ngram_min, ngram_max] that matches anywhere."""
    if k <= 0 or len(tokens) < ngram_min + 1:
        return []
    arr = np.asarray(tokens, dtype=np.int64)
    # Where an earlier occurrence of the last token ends a match (followed by >= 1 token),
    # then how far back each such match goes: one comparison per candidate and length,
    # not a window scan per n (this runs for every drafting sequence every step).
    ends = np.flatnonzero(arr[:-1] == arr[-1])
    if ends.size == 0:
        return []
    longest = min(ngram_max, len(arr) - 1)
    length = np.ones(ends.size, dtype=np.int64)
    alive = np.ones(ends.size, dtype=bool)
    for back in range(1, longest):
        alive &= ends >= back
        alive[alive] = arr[ends[alive] - back] == arr[-1 - back]
        length += alive
    best = int(length.max())
    if best < ngram_min:
        return []
    start = int(ends[length == best][-1]) + 1
    return [int(t) for t in arr[start : start + k]]


def verify(draft: Seq[int], greedy: Seq[int]) -> Verdict:
    """greedy[i] is the model's choice after the last token and draft[:i] (len(draft) + 1 rows)."""
    verdict = Verdict()
    for i, token in enumerate(draft):
        verdict.tokens.append(greedy[i])
        if greedy[i] != token:
            return verdict
        verdict.accepted += 1
    verdict.tokens.append(greedy[len(draft)])
    return verdict


def next_draft_limit(limit: int, drafted: int, accepted: int, most: int) -> int:
    """A sequence's draft length after a verification of `drafted` tokens (drafted under
    `limit`, 0 = not yet set): two more when every one was accepted (the text is being
    copied), else what was accepted plus one (at least 1)."""
    if accepted == drafted:
        return min(most, (limit or most) + 2)
    return max(1, accepted + 1)


def draft_for(seqs: Seq[Sequence], config: SpeculativeConfig, max_context: int) -> None:
    """Set each decoding sequence's draft_ids (cleared for those not drafting this step)."""
    decoding = [s for s in seqs if s.num_uncomputed_tokens == 1]
    allowed = config.num_tokens > 0 and len(decoding) <= config.max_batch
    for seq in seqs:
        seq.draft_ids = []
    if not allowed:
        return
    for seq in decoding:
        if not eligible(seq.sampling, seq.grammar is not None):
            continue
        # Leave room for the token verification adds, within max_tokens and the context.
        room = min(
            seq.max_completion_tokens - seq.num_completion_tokens - 1,
            max_context - seq.num_tokens - 1,
            seq.draft_limit or config.num_tokens,
        )
        seq.draft_ids = propose(seq.token_ids, room, config.ngram_max, config.ngram_min)
