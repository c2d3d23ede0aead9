"""The sampling surface through EngineCore on the demo checkpoint: min_tokens, logit_bias,
penalties and top_logprobs on real logits, and seeded penalised runs independent of the batch."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from llm_inference.engine.api import FinishReason, SamplingOptions, TokenEvent
from llm_inference.engine.config import EngineConfig
from llm_inference.engine.core import EngineCore

PROMPT = [0, 17, 942, 311, 1200, 87, 3021, 45]


@pytest.fixture(scope="module")
def core(demo_model_dir: Path) -> EngineCore:
    config = EngineConfig(kv_cache_memory_bytes=16 << 20, max_num_seqs=8, max_batched_tokens=256)
    return EngineCore.from_checkpoint(demo_model_dir, config, "demo-llama")


def run(
    core: EngineCore, requests: Sequence[tuple[str, SamplingOptions]]
) -> dict[str, list[TokenEvent]]:
    """All requests submitted at once (same prompt), stepped until done; events per request."""
    for request_id, sampling in requests:
        core.add_request(request_id, PROMPT, sampling)
    events: dict[str, list[TokenEvent]] = {rid: [] for rid, _ in requests}
    while core.has_work:
        for emitted in core.step():
            events[emitted.request_id].append(emitted.event)
    return events


def tokens(events: list[TokenEvent]) -> list[int]:
    return [t for e in events for t in e.token_ids]


def test_min_tokens_holds_eos_back(core: EngineCore) -> None:
    eos = core.model_config.eos_token_ids[0]
    eager = SamplingOptions(temperature=0.0, max_tokens=20, logit_bias=((eos, 100.0),))
    events = run(core, [("now", eager), ("later", replace(eager, min_tokens=5))])
    assert tokens(events["now"]) == [eos]
    later = tokens(events["later"])
    assert len(later) == 6
    assert eos not in later[:5]
    assert later[5] == eos
    assert events["later"][-1].finish_reason is FinishReason.STOP


def test_logit_bias_forces_a_token_at_plus_100(core: EngineCore) -> None:
    sampling = SamplingOptions(temperature=1.0, max_tokens=12, logit_bias=((300, 100.0),))
    assert tokens(run(core, [("forced", sampling)])["forced"]) == [300] * 12


def test_penalties_discourage_repeats(core: EngineCore) -> None:
    # A +12 bias makes greedy decoding repeat token 300 (23 of 30 times); each penalty stops it.
    base = SamplingOptions(
        temperature=0.0, max_tokens=30, ignore_eos=True, logit_bias=((300, 12.0),)
    )
    penalised = {
        "frequency": replace(base, frequency_penalty=2.0),
        "presence": replace(base, presence_penalty=2.0),
        "repetition": replace(base, repetition_penalty=2.0),
    }
    events = run(core, [("base", base), *penalised.items()])
    repeats = {rid: tokens(e).count(300) for rid, e in events.items()}
    assert repeats["base"] > 15, repeats
    for name in penalised:
        assert repeats[name] < repeats["base"] / 2, repeats


def test_top_logprobs_come_with_each_token(core: EngineCore) -> None:
    sampling = SamplingOptions(temperature=0.0, max_tokens=6, ignore_eos=True, top_logprobs=5)
    events = run(core, [("top", sampling)])["top"]
    for event in events:
        assert event.logprobs is not None
        assert event.top_logprobs is not None
        (alternatives,) = event.top_logprobs
        assert len(alternatives) == 5
        assert alternatives[0].token_id == event.token_ids[0]  # greedy picks the top one
        assert alternatives[0].logprob == event.logprobs[0]


def test_seeded_penalised_run_is_independent_of_the_batch(core: EngineCore) -> None:
    target = SamplingOptions(
        temperature=0.9, seed=11, max_tokens=25, ignore_eos=True, frequency_penalty=0.7,
        repetition_penalty=1.2, min_p=0.02, logit_bias=((5, 3.0),), min_tokens=4,
    )  # fmt: skip
    alone = tokens(run(core, [("t", target)])["t"])
    others = [
        ("a", SamplingOptions(temperature=0.0, max_tokens=10, presence_penalty=1.5)),
        ("b", SamplingOptions(temperature=1.1, max_tokens=30, top_logprobs=3)),
        ("c", SamplingOptions(temperature=0.7, seed=2, max_tokens=18, min_p=0.3)),
    ]
    batched = tokens(run(core, [others[0], ("t", target), *others[1:]])["t"])
    assert alone == batched
    assert len(alone) == 25
