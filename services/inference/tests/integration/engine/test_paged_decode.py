"""The paged decode kernel (no gather) matches the gather path and transformers on every layout."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from llm_inference.engine.api import SamplingOptions
from llm_inference.engine.paged_kernel import load_kernel

LAYOUTS = [
    "llama-gqa-untied",
    "llama-mha-tied",
    "qwen2-gqa-bias",
    "mistral-gqa",
    "llama3-rope",
    "linear-rope-sharded",
]

pytestmark = pytest.mark.skipif(load_kernel() is None, reason="no C++ toolchain for the kernel")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_paged_decode_matches_the_gather_path(
    layout: str, checkpoints: Callable[[str], Path], kit: Any
) -> None:
    path = checkpoints(layout)
    paged = kit.make_core(path, attention_backend="paged")
    gather = kit.make_core(path, attention_backend="gather")
    assert paged.runner.attention_backend == "paged"
    assert gather.runner.attention_backend == "gather"
    # Contexts across block boundaries (block size 4), ragged batch.
    prompts = kit.random_prompts(3, [5, 17, 33, 8, 61])
    for a, b in zip(
        kit.decode_logits(paged, prompts, 6, 7),
        kit.decode_logits(gather, prompts, 6, 7),
        strict=True,
    ):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_paged_decode_greedy_matches_transformers(
    checkpoints: Callable[[str], Path], hf_models: Any, kit: Any
) -> None:
    path = checkpoints("llama-gqa-untied")
    core = kit.make_core(path, attention_backend="paged")
    prompts = kit.random_prompts(4, [9, 30])
    greedy = SamplingOptions(temperature=0.0, max_tokens=20, ignore_eos=True)
    outputs = kit.run_to_completion(core, [(f"r{i}", p, greedy) for i, p in enumerate(prompts)])
    for i, prompt in enumerate(prompts):
        assert outputs[f"r{i}"] == kit.hf_greedy(hf_models(path), prompt, 20)


def test_auto_uses_the_kernel_on_cpu_float32_and_gather_forces_it_off(
    checkpoints: Callable[[str], Path], kit: Any
) -> None:
    path = checkpoints("llama-gqa-untied")
    assert kit.make_core(path).runner.attention_backend == "paged"
    assert kit.make_core(path, attention_backend="gather").runner.attention_backend == "gather"
    half = kit.make_core(path, dtype="bfloat16")
    assert half.runner.attention_backend == "gather"  # the kernel is float32 only
