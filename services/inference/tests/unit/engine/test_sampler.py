"""Sampler: greedy, temperature, top-k, top-p, per-request seeds, logprobs."""

from __future__ import annotations

import math

import torch

from llm_inference.engine.api import SamplingOptions
from llm_inference.engine.sampler import Sampler, SampleResult
from llm_inference.engine.sequence import Sequence


def _sampler(seed: int = 0) -> Sampler:
    return Sampler(torch.Generator().manual_seed(seed))


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _sample(
    sampler: Sampler,
    logits: torch.Tensor,
    options: list[SamplingOptions],
    generators: list[torch.Generator | None],
) -> SampleResult:
    """One sampler call, each row a fresh sequence (one prompt token, nothing generated)."""
    seqs = [
        Sequence(f"r{i}", [0], 1, o, o.max_tokens, generator=g)
        for i, (o, g) in enumerate(zip(options, generators, strict=True))
    ]
    return sampler(logits, seqs)


def test_greedy_picks_the_argmax() -> None:
    logits = torch.randn(5, 50)
    options = [SamplingOptions(temperature=0.0)] * 5
    result = _sample(_sampler(), logits, options, [None] * 5)
    assert result.token_ids == logits.argmax(dim=1).tolist()
    assert result.logprobs == [None] * 5


def test_top_k_one_is_greedy_even_at_high_temperature() -> None:
    logits = torch.randn(3, 40)
    options = [SamplingOptions(temperature=5.0, top_k=1)] * 3
    result = _sample(_sampler(), logits, options, [_gen(i) for i in range(3)])
    assert result.token_ids == logits.argmax(dim=1).tolist()


def test_top_k_and_top_p_restrict_the_support() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])
    sampler = _sampler()
    seen_k = {
        _sample(sampler, logits, [SamplingOptions(temperature=3.0, top_k=2)], [_gen(i)]).token_ids[
            0
        ]
        for i in range(200)
    }
    assert seen_k == {0, 1}
    # Probabilities ~ [0.64, 0.23, 0.09, ...]: top_p=0.8 keeps the first two tokens only.
    seen_p = {
        _sample(
            sampler, logits, [SamplingOptions(temperature=1.0, top_p=0.8)], [_gen(i)]
        ).token_ids[0]
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
    gen_alone, gen_batched = _gen(7), _gen(7)
    alone = []
    batched = []
    for step in range(20):
        alone.append(_sample(_sampler(step), target, [options], [gen_alone]).token_ids[0])
        noise = torch.randn(2, 100)
        batch = torch.cat([noise[:1], target, noise[1:]])
        others = [SamplingOptions(temperature=0.5), options, SamplingOptions(temperature=0.0)]
        result = _sample(_sampler(100 + step), batch, others, [None, gen_batched, None])
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
