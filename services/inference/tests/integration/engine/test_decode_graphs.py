"""Decode-only steps at bucketed fixed shapes (the CUDA-graph path, run eagerly on CPU) give the
same logits and greedy outputs as the general path, with padding rows that touch no sequence."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from llm_inference.engine.api import SamplingOptions
from llm_inference.engine.decode_graphs import batch_bucket, block_bucket

LAYOUTS = ["llama-gqa-untied", "llama-mha-tied", "qwen2-gqa-bias", "llama3-rope"]


def test_buckets() -> None:
    assert [batch_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 17, 64)] == [
        1, 2, 4, 4, 8, 8, 16, 24, 64,
    ]  # fmt: skip
    assert [block_bucket(n) for n in (0, 1, 2, 3, 4, 5, 9, 64, 65)] == [
        1, 1, 2, 4, 4, 8, 16, 64, 128,
    ]  # fmt: skip


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fixed_shape_decode_matches_the_general_path(
    layout: str, checkpoints: Callable[[str], Path], kit: Any
) -> None:
    path = checkpoints(layout)
    graphs = kit.make_core(path, cuda_graphs=True, attention_backend="gather")
    plain = kit.make_core(path, attention_backend="gather")
    assert graphs.runner.graphs is not None
    assert plain.runner.graphs is None
    # 5 rows pad to a batch of 8; contexts from 6 to 62 cross block buckets (block size 4).
    prompts = kit.random_prompts(11, [5, 17, 33, 8, 61])
    for a, b in zip(
        kit.decode_logits(graphs, prompts, 5, 5),
        kit.decode_logits(plain, prompts, 5, 5),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert {(8, 16), (8, 32)} <= set(graphs.runner.graphs._shapes)


def test_greedy_outputs_are_identical_with_mixed_prefill_and_decode(
    checkpoints: Callable[[str], Path], kit: Any, greedy: Callable[[int], SamplingOptions]
) -> None:
    path = checkpoints("llama-gqa-untied")
    prompts = kit.random_prompts(12, [3, 40, 9, 22, 1, 70, 14])
    # Staggered lengths: sequences finish at different steps, so batches shrink (7 -> 1 rows)
    # and decode-only steps alternate with steps that carry no decode at all.
    requests = [(f"r{i}", p, greedy(4 + 3 * i)) for i, p in enumerate(prompts)]
    graphs = kit.make_core(path, cuda_graphs=True, max_num_seqs=8)
    plain = kit.make_core(path, max_num_seqs=8)
    assert kit.run_to_completion(graphs, requests) == kit.run_to_completion(plain, requests)


def test_padding_rows_never_touch_a_sequences_blocks(
    checkpoints: Callable[[str], Path], kit: Any
) -> None:
    path = checkpoints("llama-gqa-untied")
    core = kit.make_core(path, cuda_graphs=True)
    runner = core.runner
    scratch = runner.num_blocks
    assert runner.kv_caches[0][0].shape[0] == scratch + 1  # one block beyond the manager's
    assert core.block_manager.num_blocks == scratch
    before = [k[:scratch].clone() for k, _ in runner.kv_caches]
    # 3 rows run at batch 4: the padding row's K/V may only land in the scratch block.
    prompts = kit.random_prompts(13, [6, 9, 12])
    kit.decode_logits(core, prompts, 1, 5)
    used = {b for s in core.scheduler.running for b in s.block_table}
    for layer, (k, _) in enumerate(runner.kv_caches):
        untouched = [b for b in range(scratch) if b not in used]
        torch.testing.assert_close(k[untouched], before[layer][untouched], rtol=0, atol=0)
