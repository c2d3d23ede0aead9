"""The paged decode kernel (no gather) matches the gather path and transformers on every layout."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from llm_inference.engine import model_runner
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


def _reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    table_rows: torch.Tensor,
    lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Softmax attention of each row over its keys, read through its block table."""
    heads, kv_heads, block = q.shape[1], k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    for r in range(q.shape[0]):
        n = int(lens[r])
        picked = tables[table_rows[r], : -(-n // block)]
        keys = k_cache[picked].transpose(0, 1).flatten(1, 2)[:, :n]  # [kv_heads, n, dim]
        values = v_cache[picked].transpose(0, 1).flatten(1, 2)[:, :n]
        keys = keys.repeat_interleave(heads // kv_heads, dim=0)
        values = values.repeat_interleave(heads // kv_heads, dim=0)
        probs = torch.softmax((q[r, :, None] * keys).sum(-1) * scale, dim=-1)
        out[r] = (probs[..., None] * values).sum(1)
    return out


# Head sizes on the register-blocked path (multiples of the vector width) and off it; group
# sizes 1 (MHA), 4 and 7 (GQA).
@pytest.mark.parametrize(("head_dim", "heads", "kv_heads"), [
    (64, 16, 4), (128, 8, 8), (16, 4, 1), (32, 14, 2), (80, 8, 2), (8, 4, 4),
])  # fmt: skip
def test_kernel_matches_attention_over_the_block_table(
    head_dim: int, heads: int, kv_heads: int
) -> None:
    kernel = load_kernel()
    assert kernel is not None
    gen = torch.Generator().manual_seed(head_dim * 31 + heads)
    blocks, block = 64, 4
    k_cache = torch.randn(blocks, kv_heads, block, head_dim, generator=gen)
    v_cache = torch.randn(blocks, kv_heads, block, head_dim, generator=gen)
    # One key, whole blocks, ragged last blocks; rows 3-5 share a table (a prefill chunk:
    # one more key each).
    lens = torch.tensor([1, 4, 5, 23, 24, 25, 37])
    table_rows = torch.tensor([0, 1, 2, 3, 3, 3, 4])
    tables = torch.randperm(blocks, generator=gen)[: 5 * 10].view(5, 10).contiguous()
    q = torch.randn(7, heads, head_dim, generator=gen)
    scale = head_dim**-0.5
    got = kernel(q, k_cache, v_cache, tables, table_rows, lens, scale)
    want = _reference(q, k_cache, v_cache, tables, table_rows, lens, scale)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


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


def test_long_context_chunks_take_the_prefill_path_in_the_same_step(
    checkpoints: Callable[[str], Path], hf_models: Any, kit: Any, monkeypatch: Any
) -> None:
    """Chunks past the kernel's context limit are prefill spans next to kernel rows (decodes
    and short chunks) in one step; chunked prefill crosses the limit mid-prompt."""
    monkeypatch.setattr(model_runner, "PAGED_CHUNK_MAX_CONTEXT", 24)
    mixed: list[int] = []  # prefill spans of steps that also had kernel rows
    spans_of = model_runner.ModelRunner._prefill_spans

    def recording(runner: Any, chunks: Any, start: int) -> Any:
        spans = spans_of(runner, chunks, start)
        if start > 0:
            mixed.append(len(spans))
        return spans

    monkeypatch.setattr(model_runner.ModelRunner, "_prefill_spans", recording)
    path = checkpoints("llama-gqa-untied")
    core = kit.make_core(path, attention_backend="paged", max_batched_tokens=32)
    prompts = kit.random_prompts(5, [7, 20, 45, 30])
    greedy = SamplingOptions(temperature=0.0, max_tokens=12, ignore_eos=True)
    outputs = kit.run_to_completion(core, [(f"r{i}", p, greedy) for i, p in enumerate(prompts)])
    for i, prompt in enumerate(prompts):
        assert outputs[f"r{i}"] == kit.hf_greedy(hf_models(path), prompt, 12)
    assert any(mixed)


def test_auto_uses_the_kernel_on_cpu_float32_and_gather_forces_it_off(
    checkpoints: Callable[[str], Path], kit: Any
) -> None:
    path = checkpoints("llama-gqa-untied")
    assert kit.make_core(path).runner.attention_backend == "paged"
    assert kit.make_core(path, attention_backend="gather").runner.attention_backend == "gather"
    half = kit.make_core(path, dtype="bfloat16")
    assert half.runner.attention_backend == "gather"  # the kernel is float32 only
