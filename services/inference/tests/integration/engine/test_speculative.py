"""Speculative decoding (prompt lookup): greedy output is token-identical, opt-out, stats."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from llm_inference.engine.api import SamplingOptions
from llm_inference.engine.config import EngineConfig
from llm_inference.engine.core import EngineCore

# Repetitive prompts (a JSON record edited in place, a code line repeated) so that n-grams of
# the prompt recur in the output, plus random ones where drafts are mostly rejected.
DEMO_CHAT = Path(__file__).resolve().parents[5] / "infra" / "model" / "demo-chat"
RECORD = '{"id": 17, "name": "widget", "tags": ["a", "b"], "price": 12.5}\n'


def _core(model_dir: Path, speculative_tokens: int, kv_block_size: int = 16) -> EngineCore:
    config = EngineConfig(
        kv_cache_memory_bytes=64 << 20,
        speculative_tokens=speculative_tokens,
        speculative_max_batch=8,
    )
    return EngineCore.from_checkpoint(
        model_dir, replace(config, kv_block_size=kv_block_size), "demo"
    )


def _prompts(core: EngineCore) -> list[list[int]]:
    tok = core.tokenizer
    assert tok is not None
    texts = [
        RECORD * 4 + RECORD.replace("widget", "gadget")[:30],
        "for item in items:\n    total += item.size\n" * 5 + "for item in",
        "<|user|>\nRename widget to gadget: " + RECORD * 2 + "<|eos|>\n<|assistant|>\n",
    ]
    prompts = [list(tok.encode(t).ids) for t in texts]  # type: ignore[attr-defined]
    return [*prompts, [7 + (i * 37) % 4000 for i in range(60)]]


def _run(core: EngineCore, prompts: list[list[int]], options: SamplingOptions) -> list[list[int]]:
    outputs: dict[str, list[int]] = {str(i): [] for i in range(len(prompts))}
    for i, prompt in enumerate(prompts):
        core.add_request(str(i), prompt, options)
    for _ in range(5000):
        if not core.has_work:
            break
        for emitted in core.step():
            outputs[emitted.request_id].extend(emitted.event.token_ids)
    assert not core.has_work
    return [outputs[str(i)] for i in range(len(prompts))]


def test_greedy_output_is_token_identical_on_the_demo_model(demo_model_dir: Path) -> None:
    # The random demo model rarely repeats itself: most drafts are rejected, some accepted.
    greedy = SamplingOptions(temperature=0.0, max_tokens=48, ignore_eos=True, detokenize=False)
    plain = _core(demo_model_dir, 0)
    prompts = _prompts(plain)
    expected = _run(plain, prompts, greedy)
    spec = _core(demo_model_dir, 4)
    assert _run(spec, prompts, greedy) == expected
    assert spec.speculative_stats.steps > 0


@pytest.mark.parametrize("draft", [3])
def test_drafts_are_accepted_on_the_trained_model_and_output_is_identical(draft: int) -> None:
    # demo-chat, trained, repeats phrases of its prompt and of its own output: lookups hit.
    greedy = SamplingOptions(temperature=0.0, max_tokens=40, ignore_eos=True, detokenize=False)
    plain = _core(DEMO_CHAT, 0)
    prompts = _prompts(plain)
    expected = _run(plain, prompts, greedy)
    spec = _core(DEMO_CHAT, draft)
    assert _run(spec, prompts, greedy) == expected
    stats = spec.speculative_stats
    assert stats.accepted > 0
    assert stats.emitted == stats.accepted + stats.steps
    assert stats.tokens_per_step > 1.0
    assert spec.num_steps < plain.num_steps


def test_eos_and_max_tokens_stop_inside_an_accepted_draft(demo_model_dir: Path) -> None:
    # EOS not ignored, odd max_tokens: a verification may emit past the end; it must not.
    options = SamplingOptions(temperature=0.0, max_tokens=37, detokenize=False)
    plain = _core(demo_model_dir, 0)
    prompts = _prompts(plain)
    expected = _run(plain, prompts, options)
    assert _run(_core(demo_model_dir, 4), prompts, options) == expected
    assert all(len(out) <= 37 for out in expected)


def test_opted_out_and_sampled_requests_are_never_drafted(demo_model_dir: Path) -> None:
    spec = _core(demo_model_dir, 4)
    prompts = _prompts(spec)
    opted_out = SamplingOptions(
        temperature=0.0, max_tokens=24, ignore_eos=True, detokenize=False, speculative=False
    )
    _run(spec, prompts, opted_out)
    sampled = SamplingOptions(temperature=0.8, seed=3, max_tokens=24, ignore_eos=True)
    _run(spec, prompts, sampled)
    assert spec.speculative_stats.steps == 0
    plain = _core(demo_model_dir, 0)
    assert _run(plain, prompts, opted_out) == _run(_core(demo_model_dir, 4), prompts, opted_out)


def test_prefix_cache_keeps_only_verified_tokens(demo_model_dir: Path) -> None:
    # Blocks registered while drafting must hash the accepted tokens only: a second request
    # whose prompt is the first's prompt + output hits the cache and still decodes identically.
    greedy = SamplingOptions(temperature=0.0, max_tokens=40, ignore_eos=True, detokenize=False)
    spec = _core(demo_model_dir, 4, kv_block_size=4)
    plain = _core(demo_model_dir, 0, kv_block_size=4)
    prompt = _prompts(spec)[0]
    first = _run(spec, [prompt], greedy)[0]
    assert first == _run(plain, [prompt], greedy)[0]
    follow = prompt + first
    assert _run(spec, [follow], greedy) == _run(plain, [follow], greedy)
    assert spec.block_manager.hit_rate > 0.5
