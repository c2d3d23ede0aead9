"""Sampler: greedy, temperature, top-k, top-p, per-request seeds, logprobs."""

from __future__ import annotations

import dataclasses
import math

import torch

from llm_inference.engine.api import SamplingOptions
from llm_inference.engine.sampler import Sampler, SampleResult, position_seed
from llm_inference.engine.sequence import Sequence


def _sampler(seed: int = 0) -> Sampler:
    return Sampler(torch.Generator().manual_seed(seed))


def _sample(
    sampler: Sampler,
    logits: torch.Tensor,
    options: list[SamplingOptions],
    seeds: list[int | None],
    history: list[int] | None = None,
) -> SampleResult:
    """One sampler call, each row a fresh sequence (`history` or one prompt token) with its
    seed (None: the options' own)."""
    seqs = [
        Sequence(f"r{i}", list(history or [0]), 1, _seeded(o, s), o.max_tokens)
        for i, (o, s) in enumerate(zip(options, seeds, strict=True))
    ]
    return sampler(logits, seqs)


def _seeded(options: SamplingOptions, seed: int | None) -> SamplingOptions:
    return options if seed is None else dataclasses.replace(options, seed=seed)


def test_greedy_picks_the_argmax() -> None:
    logits = torch.randn(5, 50)
    options = [SamplingOptions(temperature=0.0)] * 5
    result = _sample(_sampler(), logits, options, [None] * 5)
    assert result.token_ids == logits.argmax(dim=1).tolist()
    assert result.logprobs == [None] * 5


def test_top_k_one_is_greedy_even_at_high_temperature() -> None:
    logits = torch.randn(3, 40)
    options = [SamplingOptions(temperature=5.0, top_k=1)] * 3
    result = _sample(_sampler(), logits, options, list(range(3)))
    assert result.token_ids == logits.argmax(dim=1).tolist()


def test_top_k_and_top_p_restrict_the_support() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])
    sampler = _sampler()
    seen_k = {
        _sample(sampler, logits, [SamplingOptions(temperature=3.0, top_k=2)], [i]).token_ids[0]
        for i in range(200)
    }
    assert seen_k == {0, 1}
    # Probabilities ~ [0.64, 0.23, 0.09, ...]: top_p=0.8 keeps the first two tokens only.
    seen_p = {
        _sample(sampler, logits, [SamplingOptions(temperature=1.0, top_p=0.8)], [i]).token_ids[0]
        for i in range(300)
    }
    assert seen_p == {0, 1}


def test_sampling_follows_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]]))
    sampler = _sampler(1)
    counts = [0, 0, 0]
    for _ in range(2000):
        counts[
            _sample(sampler, logits, [SamplingOptions(temperature=1.0)], [None]).token_ids[0]
        ] += 1
    assert abs(counts[0] / 2000 - 0.7) < 0.05
    assert abs(counts[2] / 2000 - 0.1) < 0.03


def test_seeded_rows_do_not_depend_on_the_rest_of_the_batch() -> None:
    torch.manual_seed(0)
    target = torch.randn(1, 100)
    options = SamplingOptions(temperature=1.0, top_p=0.9, seed=7)
    alone: list[int] = []
    batched: list[int] = []
    for step in range(20):
        history = [0] * (step + 1)  # one position further each step
        alone.append(_sample(_sampler(step), target, [options], [None], history).token_ids[0])
        noise = torch.randn(2, 100)
        batch = torch.cat([noise[:1], target, noise[1:]])
        others = [SamplingOptions(temperature=0.5), options, SamplingOptions(temperature=0.0)]
        result = _sample(_sampler(100 + step), batch, others, [None, None, None], history)
        batched.append(result.token_ids[1])
    assert alone == batched
    assert len(set(alone)) > 1


def test_logprobs_are_under_the_processed_distribution() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    greedy = _sample(_sampler(), logits, [SamplingOptions(temperature=0.0, logprobs=True)], [None])
    expected = float(torch.log_softmax(logits, dim=1)[0, 0])
    assert greedy.token_ids == [0]
    assert greedy.logprobs[0] is not None
    assert math.isclose(greedy.logprobs[0], expected, rel_tol=1e-5)
    top1 = _sample(
        _sampler(), logits, [SamplingOptions(temperature=1.0, top_k=1, logprobs=True)], [None]
    )
    assert top1.logprobs[0] is not None
    assert abs(top1.logprobs[0]) < 1e-6


def test_a_seeded_draw_depends_only_on_seed_and_position() -> None:
    """What mid-stream migration needs: the same (seed, position) draws the same token on a
    fresh sampler with another default seed; another position or seed draws independently."""
    logits = torch.zeros(1, 1000)  # uniform: the draw is the noise alone
    options = [SamplingOptions(temperature=1.0, seed=42)]

    def draw(sampler_seed: int, position: int, seed: int | None = None) -> int:
        history = [0] * position
        result = _sample(_sampler(sampler_seed), logits, options, [seed], history)
        return result.token_ids[0]

    assert [draw(0, p) for p in range(1, 30)] == [draw(99, p) for p in range(1, 30)]
    assert len({draw(0, p) for p in range(1, 30)}) > 20
    assert len({draw(0, 5, seed=s) for s in range(30)}) > 20
    assert draw(0, 6, seed=42) != draw(0, 5, seed=43) or draw(0, 7, seed=42) != draw(0, 6, seed=43)


def test_position_seed_covers_64_bits_and_negative_seeds() -> None:
    seeds = {position_seed(s, p) for s in (-(2**63), -2, 0, 1, 2**64 - 1) for p in range(4)}
    assert len(seeds) == 20
    # A seed is its 64 bits: int64 -1 and uint64 max are one seed.
    assert position_seed(-1, 3) == position_seed(2**64 - 1, 3)
    assert all(0 <= s < 2**64 for s in seeds)
    torch.Generator().manual_seed(max(seeds))  # accepted by torch
