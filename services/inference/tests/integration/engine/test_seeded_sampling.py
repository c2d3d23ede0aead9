"""A seeded sampled generation is the same alone, in a batch, and across preemption."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from llm_inference.engine.api import SamplingOptions

LAYOUT = "qwen2-gqa-bias"


def test_seeded_generation_is_independent_of_the_batch(
    checkpoints: Callable[[str], Path], kit: Any
) -> None:
    path = checkpoints(LAYOUT)
    prompts = kit.random_prompts(20, [19, 7, 33, 12, 25])
    target = SamplingOptions(temperature=0.9, top_k=50, top_p=0.95, seed=1234, max_tokens=30)
    alone = kit.run_to_completion(kit.make_core(path), [("t", prompts[0], target)])["t"]
    others = [
        ("g", prompts[1], SamplingOptions(temperature=0.0, max_tokens=20)),
        ("u", prompts[2], SamplingOptions(temperature=1.2, max_tokens=25)),  # unseeded
        ("s", prompts[3], SamplingOptions(temperature=0.7, seed=99, max_tokens=35)),
        ("p", prompts[4], SamplingOptions(temperature=1.0, top_p=0.5, seed=5, max_tokens=15)),
    ]
    batched = kit.run_to_completion(
        kit.make_core(path, max_batched_tokens=16),
        [others[0], ("t", prompts[0], target), *others[1:]],
    )["t"]
    tight = kit.make_core(path, kv_cache_memory_bytes=30 * 1024)
    preempted = kit.run_to_completion(tight, [*others, ("t", prompts[0], target)])["t"]
    assert tight.scheduler.num_preemptions > 0
    assert alone == batched == preempted
    assert len(alone) == 30
    different_seed = SamplingOptions(
        temperature=0.9, top_k=50, top_p=0.95, seed=4321, max_tokens=30
    )
    other = kit.run_to_completion(kit.make_core(path), [("t", prompts[0], different_seed)])["t"]
    assert other != alone
