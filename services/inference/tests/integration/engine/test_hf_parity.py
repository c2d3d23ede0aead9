"""The engine's logits and greedy tokens match transformers on tiny random checkpoints."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from llm_inference.engine.api import SamplingOptions
from llm_inference.engine.sequence import Sequence

LAYOUT_NAMES = [
    "llama-gqa-untied",
    "llama-mha-tied",
    "qwen2-gqa-bias",
    "mistral-gqa",
    "llama3-rope",
    "linear-rope-sharded",
]
ATOL = 1e-4
RTOL = 1e-4


def _hf_last_logits(hf_model: Any, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        logits: torch.Tensor = hf_model(torch.tensor([ids])).logits[0, -1]
    return logits


def _step_logits(core: Any) -> dict[str, torch.Tensor]:
    """Run one scheduler step through the model runner; logits of each sampling sequence."""
    output = core.scheduler.schedule()
    result = core.runner.execute(output.chunks)
    for chunk in output.chunks:
        chunk.seq.num_computed_tokens = chunk.end
        core.block_manager.cache_full_blocks(chunk.seq)
    return {c.seq.request_id: result.logits[i] for i, c in enumerate(result.sampled)}


@pytest.mark.parametrize("layout", LAYOUT_NAMES)
@pytest.mark.parametrize("budget", [512, 7])  # whole prompts per step, and 7-token chunks
def test_prefill_and_decode_logits_match_transformers(
    layout: str, budget: int, checkpoints: Callable[[str], Path], hf_models: Any, kit: Any
) -> None:
    path = checkpoints(layout)
    hf = hf_models(path)
    core = kit.make_core(path, max_batched_tokens=budget)
    prompts = kit.random_prompts(1, [23, 9, 40])
    seqs = []
    for i, prompt in enumerate(prompts):
        seq = Sequence(f"s{i}", list(prompt), len(prompt), SamplingOptions(), 100, arrival_index=i)
        core.scheduler.add(seq)
        seqs.append(seq)
    # Prefill (chunked when the budget is small) then decode, teacher-forced with HF's argmax.
    for _ in range(60):
        if all(s.num_completion_tokens >= 5 for s in seqs):
            break
        logits = _step_logits(core)
        for seq in seqs:
            if seq.request_id not in logits:
                continue
            expected = _hf_last_logits(hf, seq.token_ids)
            torch.testing.assert_close(logits[seq.request_id], expected, atol=ATOL, rtol=RTOL)
            seq.token_ids.append(int(expected.argmax()))
    assert all(s.num_completion_tokens >= 5 for s in seqs)


@pytest.mark.parametrize("layout", ["llama-gqa-untied", "llama-mha-tied", "qwen2-gqa-bias"])
def test_concurrent_greedy_generations_equal_transformers(
    layout: str,
    checkpoints: Callable[[str], Path],
    hf_models: Any,
    kit: Any,
    greedy: Callable[[int], SamplingOptions],
) -> None:
    path = checkpoints(layout)
    hf = hf_models(path)
    lengths = [3, 17, 31, 64, 8, 45]
    prompts = kit.random_prompts(2, lengths)
    new_tokens = [24, 16, 20, 12, 30, 18]
    core = kit.make_core(path, max_batched_tokens=48)
    pairs = zip(prompts, new_tokens, strict=True)
    requests = [(f"r{i}", p, greedy(n)) for i, (p, n) in enumerate(pairs)]
    outputs = kit.run_to_completion(core, requests)
    for i, (prompt, n) in enumerate(zip(prompts, new_tokens, strict=True)):
        assert outputs[f"r{i}"] == kit.hf_greedy(hf, prompt, n), f"request r{i}"
    assert len(set(map(tuple, outputs.values()))) == len(outputs)  # outputs are not degenerate


def test_bfloat16_logits_close_to_float32(
    checkpoints: Callable[[str], Path], hf_models: Any, kit: Any
) -> None:
    path = checkpoints("llama-gqa-untied")
    hf = hf_models(path)
    core = kit.make_core(path, dtype="bfloat16")
    prompt = kit.random_prompts(3, [30])[0]
    core.scheduler.add(Sequence("b", list(prompt), len(prompt), SamplingOptions(), 10))
    logits = _step_logits(core)["b"]
    expected = _hf_last_logits(hf, prompt)
    assert logits.dtype == torch.float32
    # bfloat16 keeps ~3 significant digits: compare relative to the logit spread.
    assert (logits - expected).abs().max() < 0.1 * expected.std()
