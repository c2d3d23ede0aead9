"""Batched sampling: logit bias and penalties, greedy, temperature, min-p, top-k, top-p,
seeded draws keyed by (seed, position), logprobs and top alternatives."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from .api import SamplingOptions, TopToken
from .penalties import adjust_logits
from .sequence import Sequence


@dataclass(frozen=True, slots=True)
class SampleResult:
    """Per row: the chosen token and, where asked for, its log-probability and alternatives."""

    token_ids: list[int]
    logprobs: list[float | None]
    # The top_logprobs most likely tokens, most likely first (None where not asked for).
    top_logprobs: list[tuple[TopToken, ...] | None]


@dataclass(frozen=True, slots=True)
class _Logprobs:
    chosen: list[float | None]
    top: list[tuple[TopToken, ...] | None]


class Sampler:
    """Samples one token per row of float32 logits.

    Order per row: logit_bias, repetition/presence/frequency penalties and min_tokens on the raw
    logits (masks applied before the sampler stay -inf), then temperature, min-p, top-k, top-p.
    Random rows use the exponential race (argmax of p / E with E ~ Exp(1)), equivalent to drawing
    from p. A seeded row's noise is a function of (seed, position of the token being sampled)
    only, so its tokens depend neither on the rest of the batch nor on the history of the
    process: a request resumed elsewhere with the tokens already produced (mid-stream migration)
    draws the same numbers as the unbroken run. Logprobs are under the processed distribution
    (temperature, min-p, top-k, top-p); greedy rows report them at temperature 1.
    """

    def __init__(self, default_generator: torch.Generator) -> None:
        self._default = default_generator
        # Re-seeded for every seeded row; one object avoids an allocation per row and step.
        self._keyed = torch.Generator(device=default_generator.device)

    def __call__(
        self,
        logits: torch.Tensor,
        seqs: Seq[Sequence],
        eos_token_ids: Seq[int] = (),
    ) -> SampleResult:
        """One token per row of `logits` (row i belongs to seqs[i], whose history it reads)."""
        options = [seq.sampling for seq in seqs]
        logits = adjust_logits(logits, seqs, eos_token_ids)
        greedy = [o.temperature == 0.0 for o in options]
        if all(greedy) and not any(_wants_logprobs(o) for o in options):
            rows = len(options)
            return SampleResult(logits.argmax(dim=-1).tolist(), [None] * rows, [None] * rows)
        processed = _process(logits, options, greedy)
        tokens = processed.argmax(dim=-1)
        random_rows = [i for i, g in enumerate(greedy) if not g]
        if random_rows:
            probs = torch.softmax(processed[random_rows], dim=-1)
            noise = self._noise(probs, [seqs[i] for i in random_rows])
            tokens[random_rows] = (probs / noise).argmax(dim=-1)
        token_list: list[int] = tokens.tolist()
        logprobs = _logprobs(processed, tokens, options)
        return SampleResult(token_list, logprobs.chosen, logprobs.top)

    def _noise(self, probs: torch.Tensor, seqs: Seq[Sequence]) -> torch.Tensor:
        noise = torch.empty_like(probs)
        shared = [i for i, seq in enumerate(seqs) if seq.sampling.seed is None]
        if shared:
            draws = torch.empty(len(shared), probs.shape[1], device=probs.device)
            noise[shared] = draws.exponential_(generator=self._default)
        for i, seq in enumerate(seqs):
            seed = seq.sampling.seed
            if seed is not None:
                # The token being sampled lands at index num_tokens of the sequence.
                self._keyed.manual_seed(position_seed(seed, seq.num_tokens))
                noise[i].exponential_(generator=self._keyed)
        return noise


_MASK64 = (1 << 64) - 1


def position_seed(seed: int, position: int) -> int:
    """A 64-bit generator seed for one (request seed, token position) pair.

    SplitMix64's finaliser over the seed and the golden-ratio-spaced position: neighbouring
    positions and seeds get unrelated streams (manual_seed(seed + position) would make request
    seed s at position p + 1 replay seed s + 1 at position p).
    """
    z = ((seed & _MASK64) ^ ((position + 1) * 0x9E3779B97F4A7C15)) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def _process(
    logits: torch.Tensor, options: Seq[SamplingOptions], greedy: list[bool]
) -> torch.Tensor:
    """Logits after temperature, min-p, top-k and top-p (masked entries are -inf)."""
    temps = torch.tensor(
        [1.0 if g else o.temperature for o, g in zip(options, greedy, strict=True)],
        device=logits.device,
    )
    scaled = _min_p(logits / temps[:, None], options)
    top_k = [o.top_k for o in options]
    top_p = [o.top_p for o in options]
    if all(k <= 0 for k in top_k) and all(p >= 1.0 for p in top_p):
        return scaled
    vocab = scaled.shape[1]
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=scaled.device)
    k = torch.tensor([kk if kk > 0 else vocab for kk in top_k], device=scaled.device)
    drop = ranks[None, :] >= k[:, None]
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    p = torch.tensor(top_p, device=scaled.device)
    probs = torch.softmax(sorted_logits, dim=-1)
    # Drop a token once the mass before it already reaches top_p; the first token always stays.
    mass_before = probs.cumsum(dim=-1) - probs
    sorted_logits = sorted_logits.masked_fill(mass_before >= p[:, None], float("-inf"))
    return torch.full_like(scaled, float("-inf")).scatter(1, order, sorted_logits)


def _min_p(scaled: torch.Tensor, options: Seq[SamplingOptions]) -> torch.Tensor:
    """Drop tokens less likely than min_p times the most likely one (p_i < min_p * p_max)."""
    if all(o.min_p <= 0.0 for o in options):
        return scaled
    # In log space: logit_i - logit_max < log(min_p); min_p = 0 gives -inf, dropping nothing.
    log_min_p = torch.tensor([o.min_p for o in options], device=scaled.device).log()
    gap = scaled - scaled.max(dim=-1, keepdim=True).values
    return scaled.masked_fill(gap < log_min_p[:, None], float("-inf"))


def _wants_logprobs(options: SamplingOptions) -> bool:
    return options.logprobs or options.top_logprobs > 0


def _logprobs(
    processed: torch.Tensor, tokens: torch.Tensor, options: Seq[SamplingOptions]
) -> _Logprobs:
    """Chosen-token logprobs and top alternatives, both under the processed distribution."""
    result = _Logprobs([None] * len(options), [None] * len(options))
    rows = [i for i, o in enumerate(options) if _wants_logprobs(o)]
    if not rows:
        return result
    log_probs = torch.log_softmax(processed[rows], dim=-1)
    chosen = log_probs.gather(1, tokens[rows][:, None]).squeeze(1).tolist()
    for row, value in zip(rows, chosen, strict=True):
        result.chosen[row] = float(value)
    top_rows = [j for j, row in enumerate(rows) if options[row].top_logprobs > 0]
    if top_rows:
        _fill_top(result.top, log_probs[top_rows], [rows[j] for j in top_rows], options)
    return result


def _fill_top(
    out: list[tuple[TopToken, ...] | None],
    log_probs: torch.Tensor,
    rows: list[int],
    options: Seq[SamplingOptions],
) -> None:
    """Per row, its top_logprobs most likely tokens; masked (-inf) ones are not alternatives."""
    k = min(max(options[row].top_logprobs for row in rows), log_probs.shape[1])
    values, ids = log_probs.topk(k, dim=-1)
    for row, row_values, row_ids in zip(rows, values.tolist(), ids.tolist(), strict=True):
        n = options[row].top_logprobs
        out[row] = tuple(
            TopToken(token_id, value)
            for token_id, value in zip(row_ids[:n], row_values[:n], strict=True)
            if value != float("-inf")
        )
