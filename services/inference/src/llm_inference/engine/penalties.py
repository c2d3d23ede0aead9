"""Per-row logit adjustments before temperature: logit_bias, repetition, presence and frequency
penalties, min_tokens. Each runs batched over only the rows that use it; a batch where no row
uses any returns its logits untouched. -inf entries (masked tokens) stay -inf."""

from __future__ import annotations

from collections.abc import Iterable
from collections.abc import Sequence as Seq

import torch

from .api import SamplingOptions
from .sequence import Sequence

NEG_INF = float("-inf")


def needs_adjusting(options: SamplingOptions) -> bool:
    """Whether a row's options change its logits before temperature."""
    return bool(
        options.logit_bias
        or options.min_tokens > 0
        or options.presence_penalty != 0.0
        or options.frequency_penalty != 0.0
        or options.repetition_penalty != 1.0
    )


def adjust_logits(
    logits: torch.Tensor, seqs: Seq[Sequence], eos_token_ids: Seq[int]
) -> torch.Tensor:
    """Logits with bias, penalties and min_tokens applied; a copy (the input is not changed)."""
    rows = [i for i, seq in enumerate(seqs) if needs_adjusting(seq.sampling)]
    if not rows:
        return logits
    out = logits.clone()
    _add_bias(out, [(i, seqs[i]) for i in rows if seqs[i].sampling.logit_bias])
    _repetition(out, [(i, seqs[i]) for i in rows if seqs[i].sampling.repetition_penalty != 1.0])
    _presence_frequency(out, [(i, seqs[i]) for i in rows if _counts_output(seqs[i].sampling)])
    _min_tokens(out, [(i, seqs[i]) for i in rows if _too_short(seqs[i])], eos_token_ids)
    return out


def _counts_output(options: SamplingOptions) -> bool:
    return options.presence_penalty != 0.0 or options.frequency_penalty != 0.0


def _too_short(seq: Sequence) -> bool:
    return seq.num_completion_tokens < seq.sampling.min_tokens


class _Flat:
    """Ragged per-row token ids (CPU tensors) flattened into one (row, token) index."""

    def __init__(self) -> None:
        self._rows: list[int] = []
        self._sizes: list[int] = []
        self._parts: list[torch.Tensor] = []
        self._values: list[float] = []

    def add(self, row: int, tokens: torch.Tensor, value: float = 0.0) -> None:
        """Tokens of `row`; `value` is what values() repeats for each of them."""
        self._rows.append(row)
        self._sizes.append(len(tokens))
        self._parts.append(tokens)
        self._values.append(value)

    @property
    def size(self) -> int:
        return sum(self._sizes)

    def index(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self._repeat(torch.tensor(self._rows, dtype=torch.long))
        return rows.to(device), torch.cat(self._parts).to(device)

    def values(self, like: torch.Tensor) -> torch.Tensor:
        return self._repeat(torch.tensor(self._values, dtype=like.dtype)).to(like.device)

    def _repeat(self, per_part: torch.Tensor) -> torch.Tensor:
        sizes = torch.tensor(self._sizes, dtype=torch.long)
        return per_part.repeat_interleave(sizes, output_size=self.size)


def _ids(tokens: Iterable[int]) -> torch.Tensor:
    return torch.tensor(list(tokens), dtype=torch.long)


def _add_bias(logits: torch.Tensor, rows: list[tuple[int, Sequence]]) -> None:
    if not rows:
        return
    flat = _Flat()
    values: list[float] = []
    for row, seq in rows:
        flat.add(row, _ids(token for token, _ in seq.sampling.logit_bias))
        values.extend(bias for _, bias in seq.sampling.logit_bias)
    bias = torch.tensor(values, dtype=logits.dtype, device=logits.device)
    logits.index_put_(flat.index(logits.device), bias, accumulate=True)


def _repetition(logits: torch.Tensor, rows: list[tuple[int, Sequence]]) -> None:
    """HF semantics over prompt and output: positive logits divided, negative multiplied."""
    if not rows:
        return
    flat = _Flat()
    for row, seq in rows:
        penalty = seq.sampling.repetition_penalty
        flat.add(row, seq.distinct_prompt_ids(), penalty)
        flat.add(row, _ids(seq.output_counts()), penalty)
    # Sparse over the history: an id in prompt and output is written twice, the same value.
    index = flat.index(logits.device)
    penalties = flat.values(logits)
    values = logits[index]
    logits[index] = torch.where(values > 0, values / penalties, values * penalties)


def _presence_frequency(logits: torch.Tensor, rows: list[tuple[int, Sequence]]) -> None:
    """OpenAI semantics over output tokens: logit -= frequency * count + presence."""
    if not rows:
        return
    flat = _Flat()
    deltas: list[float] = []
    for row, seq in rows:
        counts = seq.output_counts()
        options = seq.sampling
        flat.add(row, _ids(counts))
        frequency, presence = options.frequency_penalty, options.presence_penalty
        deltas.extend(-(frequency * count + presence) for count in counts.values())
    if deltas:
        delta = torch.tensor(deltas, dtype=logits.dtype, device=logits.device)
        logits.index_put_(flat.index(logits.device), delta, accumulate=True)


def _min_tokens(
    logits: torch.Tensor, rows: list[tuple[int, Sequence]], eos_token_ids: Seq[int]
) -> None:
    """Ban EOS (unless ignored) and the stop token ids until min_tokens were generated."""
    flat = _Flat()
    for row, seq in rows:
        options = seq.sampling
        eos = () if options.ignore_eos else eos_token_ids
        flat.add(row, _ids((*options.stop_token_ids, *eos)))
    if not flat.size:
        return
    index = flat.index(logits.device)
    before = logits[index]
    logits[index] = NEG_INF
    # When the ban would leave nothing (a grammar allowing only EOS here), the grammar wins.
    dead = torch.isneginf(logits).all(dim=-1)
    restore = dead[index[0]]
    if bool(restore.any()):
        logits[index[0][restore], index[1][restore]] = before[restore]
