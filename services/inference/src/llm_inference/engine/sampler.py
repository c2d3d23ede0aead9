"""Batched sampling: greedy, temperature, top-k, top-p, per-request seeded generators, logprobs."""

from __future__ import annotations

from collections.abc import Sequence as Seq
from dataclasses import dataclass

import torch

from .api import SamplingOptions


@dataclass(frozen=True, slots=True)
class SampleResult:
    """Chosen token per row and, where asked for, its log-probability."""

    token_ids: list[int]
    logprobs: list[float | None]


class Sampler:
    """Samples one token per row of float32 logits.

    Random rows use the exponential race (argmax of p / E with E ~ Exp(1)), equivalent to drawing
    from p; each seeded request draws its noise from its own torch.Generator, so its tokens do not
    depend on what else is in the batch. Logprobs are under the processed distribution
    (temperature, top-k, top-p); greedy rows report them at temperature 1.
    """

    def __init__(self, default_generator: torch.Generator) -> None:
        self._default = default_generator

    def __call__(
        self,
        logits: torch.Tensor,
        options: Seq[SamplingOptions],
        generators: Seq[torch.Generator | None],
    ) -> SampleResult:
        greedy = [o.temperature == 0.0 for o in options]
        want_logprobs = any(o.logprobs for o in options)
        if all(greedy) and not want_logprobs:
            return SampleResult(logits.argmax(dim=-1).tolist(), [None] * len(options))
        processed = _process(logits, options, greedy)
        tokens = processed.argmax(dim=-1)
        random_rows = [i for i, g in enumerate(greedy) if not g]
        if random_rows:
            probs = torch.softmax(processed[random_rows], dim=-1)
            noise = self._noise(probs, [generators[i] for i in random_rows])
            tokens[random_rows] = (probs / noise).argmax(dim=-1)
        token_list: list[int] = tokens.tolist()
        return SampleResult(token_list, _logprobs(processed, tokens, options))

    def _noise(self, probs: torch.Tensor, generators: Seq[torch.Generator | None]) -> torch.Tensor:
        noise = torch.empty_like(probs)
        shared = [i for i, g in enumerate(generators) if g is None]
        if shared:
            draws = torch.empty(len(shared), probs.shape[1], device=probs.device)
            noise[shared] = draws.exponential_(generator=self._default)
        for i, generator in enumerate(generators):
            if generator is not None:
                noise[i].exponential_(generator=generator)
        return noise


def _process(
    logits: torch.Tensor, options: Seq[SamplingOptions], greedy: list[bool]
) -> torch.Tensor:
    """Logits after temperature, top-k and top-p (masked entries are -inf)."""
    temps = torch.tensor(
        [1.0 if g else o.temperature for o, g in zip(options, greedy, strict=True)],
        device=logits.device,
    )
    scaled = logits / temps[:, None]
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


def _logprobs(
    processed: torch.Tensor, tokens: torch.Tensor, options: Seq[SamplingOptions]
) -> list[float | None]:
    rows = [i for i, o in enumerate(options) if o.logprobs]
    result: list[float | None] = [None] * len(options)
    if not rows:
        return result
    log_probs = torch.log_softmax(processed[rows], dim=-1)
    chosen = log_probs.gather(1, tokens[rows][:, None]).squeeze(1).tolist()
    for row, value in zip(rows, chosen, strict=True):
        result[row] = float(value)
    return result
