"""Sampler processing on hand-made logits: logit_bias, repetition/presence/frequency penalties
(against a straightforward reference), min_tokens, min_p and top_logprobs."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence as Seq
from dataclasses import replace

import torch

from llm_inference.engine.api import SamplingOptions
from llm_inference.engine.penalties import adjust_logits
from llm_inference.engine.sampler import Sampler, SampleResult
from llm_inference.engine.sequence import Sequence

VOCAB = 40
EOS = (3,)
NEG_INF = float("-inf")


def _seq(
    options: SamplingOptions,
    prompt: Seq[int] = (0,),
    output: Seq[int] = (),
    seed: int | None = None,
) -> Sequence:
    if seed is not None:
        options = replace(options, seed=seed)
    return Sequence("r", [*prompt, *output], len(prompt), options, options.max_tokens)


def _sample(logits: torch.Tensor, seqs: Seq[Sequence], sampler_seed: int = 0) -> SampleResult:
    return Sampler(torch.Generator().manual_seed(sampler_seed))(logits, seqs, EOS)


def _reference(row: torch.Tensor, seq: Sequence) -> torch.Tensor:
    """The adjustments written the obvious way, one token at a time."""
    out = row.clone()
    options = seq.sampling
    for token, bias in options.logit_bias:
        out[token] += bias
    for token in set(seq.token_ids):
        penalty = options.repetition_penalty
        out[token] = out[token] / penalty if out[token] > 0 else out[token] * penalty
    for token, count in Counter(seq.token_ids[seq.num_prompt_tokens :]).items():
        out[token] -= options.frequency_penalty * count + options.presence_penalty
    if seq.num_completion_tokens < options.min_tokens:
        for token in (*options.stop_token_ids, *(() if options.ignore_eos else EOS)):
            out[token] = NEG_INF
    return out


def _mixed_batch(logprobs: bool = False) -> list[Sequence]:
    prompts = torch.randint(0, VOCAB, (5, 12), generator=torch.Generator().manual_seed(1))
    outputs = torch.randint(0, 10, (5, 15), generator=torch.Generator().manual_seed(2))
    options = [
        SamplingOptions(presence_penalty=0.7, frequency_penalty=0.3),
        SamplingOptions(),  # no adjustments: must come out unchanged
        SamplingOptions(repetition_penalty=1.6, logit_bias=((5, 4.0), (6, -3.5))),
        SamplingOptions(
            frequency_penalty=-1.1, repetition_penalty=0.7, min_tokens=40, stop_token_ids=(9,)
        ),
        SamplingOptions(presence_penalty=-2.0, min_tokens=3, logit_bias=((0, 100.0),)),
    ]
    return [
        _seq(replace(o, logprobs=logprobs), prompts[i].tolist(), outputs[i].tolist())
        for i, o in enumerate(options)
    ]


def test_adjustments_match_the_reference_and_keep_masked_entries() -> None:
    seqs = _mixed_batch()
    logits = torch.randn(len(seqs), VOCAB, generator=torch.Generator().manual_seed(3)) * 3
    logits[:, 7] = NEG_INF  # masked before the sampler (e.g. by a grammar)
    adjusted = adjust_logits(logits, seqs, EOS)
    for i, seq in enumerate(seqs):
        torch.testing.assert_close(adjusted[i], _reference(logits[i], seq))
    assert torch.isneginf(adjusted[:, 7]).all()
    assert torch.equal(adjusted[1], logits[1])
    assert not torch.equal(adjusted, logits)  # the input itself is left as it was


def test_no_adjusting_rows_cost_nothing() -> None:
    logits = torch.randn(3, VOCAB)
    seqs = [_seq(SamplingOptions(temperature=t), output=[1, 1, 2]) for t in (0.0, 0.5, 1.0)]
    assert adjust_logits(logits, seqs, EOS) is logits


def test_output_counts_follow_appended_tokens() -> None:
    options = SamplingOptions(frequency_penalty=0.5, presence_penalty=0.25)
    seq = _seq(options, prompt=[4, 4, 5])
    logits = torch.zeros(1, VOCAB)
    for token in [4, 8, 8, 4, 8]:
        seq.token_ids.append(token)
        adjusted = adjust_logits(logits, [seq], EOS)
        torch.testing.assert_close(adjusted[0], _reference(logits[0], seq))
    assert seq.output_counts() == Counter({8: 3, 4: 2})


def test_penalised_logprobs_are_those_of_the_reference() -> None:
    seqs = _mixed_batch(logprobs=True)
    logits = torch.randn(len(seqs), VOCAB, generator=torch.Generator().manual_seed(4))
    result = _sample(logits, seqs)
    for i, seq in enumerate(seqs):
        expected = torch.log_softmax(_reference(logits[i], seq), dim=-1)[result.token_ids[i]]
        assert math.isclose(result.logprobs[i] or 0.0, float(expected), abs_tol=1e-5)


def test_logit_bias_forces_and_bans_tokens() -> None:
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(5))
    forced = SamplingOptions(temperature=1.0, logit_bias=((11, 100.0),))
    assert {_sample(logits, [_seq(forced, seed=s)]).token_ids[0] for s in range(50)} == {11}
    favourite = int(logits.argmax())
    banned = SamplingOptions(temperature=0.0, logit_bias=((favourite, -100.0),))
    assert _sample(logits, [_seq(banned)]).token_ids[0] != favourite
    flat = torch.zeros(1, VOCAB)
    banned_random = SamplingOptions(temperature=1.0, logit_bias=((2, -100.0),))
    draws = {_sample(flat, [_seq(banned_random, seed=s)]).token_ids[0] for s in range(300)}
    assert 2 not in draws
    assert len(draws) > 20


def test_min_tokens_suppresses_eos_and_stop_ids_until_reached() -> None:
    logits = torch.zeros(1, VOCAB)
    logits[0, EOS[0]] = 50.0
    logits[0, 9] = 40.0
    logits[0, 20] = 5.0
    options = SamplingOptions(temperature=0.0, min_tokens=3, stop_token_ids=(9,))
    early = _seq(options, output=[12, 13])
    assert _sample(logits, [early]).token_ids == [20]
    reached = _seq(options, output=[12, 13, 14])
    assert _sample(logits, [reached]).token_ids == [EOS[0]]
    ignoring = _seq(SamplingOptions(temperature=0.0, min_tokens=3, ignore_eos=True), output=[12])
    assert _sample(logits, [ignoring]).token_ids == [EOS[0]]  # EOS is not a stop here


def test_min_tokens_yields_when_it_would_leave_nothing() -> None:
    logits = torch.full((1, VOCAB), NEG_INF)
    logits[0, EOS[0]] = 0.0  # e.g. a grammar that allows only EOS here
    seq = _seq(SamplingOptions(temperature=0.7, min_tokens=5), seed=0)
    assert _sample(logits, [seq]).token_ids == [EOS[0]]


def test_min_p_drops_unlikely_tokens_after_temperature() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    options = SamplingOptions(temperature=1.0, min_p=0.2, top_logprobs=4)
    draws = [_sample(logits, [_seq(options, seed=s)]) for s in range(300)]
    assert {d.token_ids[0] for d in draws} == {0, 1, 2}  # 0.05 < 0.2 * 0.5
    alternatives = draws[0].top_logprobs[0]
    assert alternatives is not None
    assert [t.token_id for t in alternatives] == [0, 1, 2]  # masked tokens are no alternative
    expected = torch.log(torch.tensor([0.5, 0.3, 0.15]) / 0.95)
    assert torch.allclose(torch.tensor([t.logprob for t in alternatives]), expected, atol=1e-5)
    # At temperature 3 the distribution flattens: 0.05 is now above 0.2 x the largest.
    hot = SamplingOptions(temperature=3.0, min_p=0.2)
    assert 3 in {_sample(logits, [_seq(hot, seed=s)]).token_ids[0] for s in range(400)}


def test_top_logprobs_are_sorted_and_consistent_with_the_chosen_token() -> None:
    logits = torch.randn(3, 100, generator=torch.Generator().manual_seed(6)) * 2
    options = [
        SamplingOptions(temperature=0.0, top_logprobs=5),
        SamplingOptions(temperature=0.8, top_k=30, top_logprobs=20, seed=1),
        SamplingOptions(temperature=1.0, logprobs=True),  # logprobs only
    ]
    seqs = [_seq(o, seed=o.seed) for o in options]
    result = _sample(logits, seqs)
    greedy_top, sampled_top = result.top_logprobs[0], result.top_logprobs[1]
    assert greedy_top is not None
    assert sampled_top is not None
    assert result.top_logprobs[2] is None
    assert (len(greedy_top), len(sampled_top)) == (5, 20)
    for top in (greedy_top, sampled_top):
        values = [t.logprob for t in top]
        assert values == sorted(values, reverse=True)
    assert greedy_top[0].token_id == result.token_ids[0]
    assert greedy_top[0].logprob == result.logprobs[0]
    expected = torch.log_softmax(logits[0], dim=-1).topk(5)
    assert [t.token_id for t in greedy_top] == expected.indices.tolist()
    by_id = {t.token_id: t.logprob for t in sampled_top}
    chosen = result.token_ids[1]
    assert chosen in by_id  # top_k=30 rows sample among few, mostly likely ones
    assert math.isclose(by_id[chosen], result.logprobs[1] or 0.0, abs_tol=1e-6)


def test_top_logprobs_imply_logprobs() -> None:
    options = SamplingOptions(temperature=0.0, top_logprobs=2)
    result = _sample(torch.randn(1, VOCAB), [_seq(options)])
    assert result.logprobs[0] is not None
    assert result.top_logprobs[0] is not None
    assert len(result.top_logprobs[0]) == 2


def test_seeded_penalised_rows_do_not_depend_on_the_batch() -> None:
    options = SamplingOptions(
        temperature=1.0, seed=7, frequency_penalty=0.8, repetition_penalty=1.3, min_p=0.05
    )
    target = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(8))
    alone_seq, batched_seq = _seq(options, [1, 2], seed=7), _seq(options, [1, 2], seed=7)
    alone, batched = [], []
    for step in range(15):
        alone.append(_sample(target, [alone_seq], step).token_ids[0])
        alone_seq.token_ids.append(alone[-1])
        noise = torch.randn(2, VOCAB)
        others = [_seq(SamplingOptions(presence_penalty=1.0), output=[3, 4]),
                  _seq(SamplingOptions(temperature=0.0, logit_bias=((1, 5.0),)))]  # fmt: skip
        batch = torch.cat([noise[:1], target, noise[1:]])
        batched.append(_sample(batch, [others[0], batched_seq, others[1]], 100 + step).token_ids[1])
        batched_seq.token_ids.append(batched[-1])
    assert alone == batched
    assert len(set(alone)) > 1
