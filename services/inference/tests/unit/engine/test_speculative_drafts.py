"""Prompt-lookup drafting, greedy verification and eligibility (no model needed)."""

from __future__ import annotations

import random

import pytest

from llm_common.config import ConfigError
from llm_inference.engine.api import SamplingOptions
from llm_inference.engine.block_manager import BlockManager
from llm_inference.engine.config import EngineConfig
from llm_inference.engine.scheduler import Scheduler
from llm_inference.engine.sequence import Sequence
from llm_inference.engine.speculative import (
    SpeculativeConfig,
    draft_for,
    eligible,
    next_draft_limit,
    propose,
    verify,
)

GREEDY = SamplingOptions(temperature=0.0, max_tokens=50)


def test_propose_takes_what_followed_the_most_recent_longest_match() -> None:
    tokens = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert propose(tokens, 3, ngram_max=3, ngram_min=1) == [7, 8, 5]
    # Only a 1-gram matches: 4 follows the earlier 6.
    assert propose([6, 4, 5, 6], 2, ngram_max=3, ngram_min=1) == [4, 5]
    assert propose([1, 2, 3, 4], 4, ngram_max=3, ngram_min=1) == []
    assert propose([5, 5], 0, ngram_max=3, ngram_min=1) == []
    # The draft may run to the end of the sequence: fewer than k tokens.
    assert propose([4, 2, 4], 5, ngram_max=2, ngram_min=1) == [2, 4]


def _by_definition(tokens: list[int], k: int, ngram_max: int, ngram_min: int) -> list[int]:
    """The slow, obvious reading of propose's contract: each n from the longest, each window."""
    if k <= 0:
        return []
    for n in range(min(ngram_max, len(tokens) - 1), ngram_min - 1, -1):
        starts = [s for s in range(len(tokens) - n) if tokens[s : s + n] == tokens[-n:]]
        if starts:
            return tokens[starts[-1] + n : starts[-1] + n + k]
    return []


def test_propose_matches_its_definition_on_random_sequences() -> None:
    rng = random.Random(35)
    for _ in range(3000):
        tokens = [rng.randrange(rng.choice((2, 4, 9))) for _ in range(rng.randrange(1, 40))]
        k, ngram_max = rng.randrange(0, 6), rng.randrange(1, 5)
        ngram_min = rng.randrange(1, ngram_max + 1)
        expected = _by_definition(tokens, k, ngram_max, ngram_min)
        assert propose(tokens, k, ngram_max, ngram_min) == expected, (tokens, k, ngram_max)


def test_verify_accepts_the_agreeing_prefix_plus_one_model_token() -> None:
    assert verify([5, 6, 7], [5, 6, 7, 8]).tokens == [5, 6, 7, 8]
    assert verify([5, 6, 7], [5, 6, 7, 8]).accepted == 3
    rejected = verify([5, 6, 7], [5, 9, 1, 1])
    assert (rejected.tokens, rejected.accepted) == ([5, 9], 1)
    assert verify([5], [4, 0]).tokens == [4]


def test_only_history_free_greedy_requests_are_eligible() -> None:
    assert eligible(GREEDY, has_grammar=False)
    assert not eligible(GREEDY, has_grammar=True)
    for change in (
        {"speculative": False},
        {"temperature": 0.7},
        {"logprobs": True},
        {"top_logprobs": 2},
        {"repetition_penalty": 1.2},
        {"presence_penalty": 0.5},
        {"logit_bias": ((5, 1.0),)},
        {"min_tokens": 3},
    ):
        options = SamplingOptions(**{"temperature": 0.0, **change})  # type: ignore[arg-type]
        assert not eligible(options, has_grammar=False), change


def test_draft_length_grows_while_copied_and_shrinks_to_what_was_accepted() -> None:
    assert next_draft_limit(0, drafted=4, accepted=4, most=8) == 8  # unset: starts at most
    assert next_draft_limit(3, drafted=3, accepted=3, most=8) == 5
    assert next_draft_limit(7, drafted=2, accepted=2, most=8) == 8  # capped at most
    assert next_draft_limit(8, drafted=8, accepted=2, most=8) == 3
    assert next_draft_limit(5, drafted=5, accepted=0, most=8) == 1  # never below one


def test_a_sequences_draft_limit_caps_its_next_draft() -> None:
    config = SpeculativeConfig(num_tokens=4, max_batch=2)
    seq = _decoding("a", [1, 2, 3, 1, 2, 3, 4, 5, 1, 2])
    seq.draft_limit = 2
    draft_for([seq], config, max_context=100)
    assert seq.draft_ids == [3, 4]


def _decoding(rid: str, tokens: list[int], max_tokens: int = 50) -> Sequence:
    options = SamplingOptions(temperature=0.0, max_tokens=max_tokens)
    seq = Sequence(rid, tokens, len(tokens) - 1, options, max_tokens)
    seq.num_computed_tokens = len(tokens) - 1
    return seq


def test_drafts_respect_max_tokens_the_context_and_the_batch_limit() -> None:
    config = SpeculativeConfig(num_tokens=4, max_batch=2)
    seq = _decoding("a", [1, 2, 3, 1, 2, 3, 4, 5, 1, 2])
    draft_for([seq], config, max_context=100)
    assert seq.draft_ids == [3, 4, 5, 1]
    short = _decoding("b", [1, 2, 3, 1, 2, 3, 4, 5, 1, 2], max_tokens=3)  # 1 generated, 2 left
    draft_for([short], config, max_context=100)
    assert short.draft_ids == [3]
    draft_for([seq], config, max_context=12)
    assert seq.draft_ids == [3]
    crowd = [_decoding(str(i), [1, 2, 1, 2]) for i in range(3)]
    draft_for(crowd, config, max_context=100)
    assert all(s.draft_ids == [] for s in crowd)


def test_scheduler_runs_the_last_token_and_its_draft_as_one_chunk() -> None:
    manager = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    scheduler = Scheduler(manager, max_num_seqs=4, max_batched_tokens=64)
    seq = Sequence("a", [1, 2, 3, 1, 2], 5, GREEDY, 50)
    scheduler.add(seq)
    first = scheduler.schedule()
    seq.num_computed_tokens = first.chunks[0].end
    seq.token_ids.append(3)
    seq.draft_ids = [1, 2, 3]
    chunk = scheduler.schedule().chunks[0]
    assert (chunk.start, chunk.num_tokens, chunk.num_draft) == (5, 4, 3)
    assert chunk.token_ids() == [3, 1, 2, 3]
    assert chunk.samples
    assert len(seq.block_table) * 4 >= 9  # slots for every drafted position


def test_engine_config_refuses_an_empty_ngram_range() -> None:
    with pytest.raises(ConfigError, match="speculative_ngram_min"):
        EngineConfig(speculative_ngram_min=4, speculative_ngram_max=3)
    with pytest.raises(ConfigError, match="speculative_ngram_min"):
        EngineConfig(speculative_ngram_min=0)
    assert EngineConfig().speculative_ngram_min == 1
