"""The fused CPU ops (csrc/fused_ops.cpp) against torch's own: RMSNorm, add + RMSNorm, RoPE and
silu(gate) * up at every row count a step has, and a whole model with and without them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from llm_inference.engine.fused_ops import load_fused_ops
from llm_inference.engine.loader import load_model
from llm_inference.engine.models.rope import apply_rope

OPS = load_fused_ops()
pytestmark = pytest.mark.skipif(OPS is None, reason="no C++ toolchain for the fused ops")


@pytest.mark.parametrize("rows", [0, 1, 5, 64, 700])
@pytest.mark.parametrize("width", [64, 1000])
def test_norms_match_torch(rows: int, width: int) -> None:
    assert OPS is not None
    generator = torch.Generator().manual_seed(rows + width)
    x, y = torch.randn(2, rows, width, generator=generator) * 3
    w = torch.randn(width, generator=generator)
    expected = torch.rms_norm(x, (width,), w, 1e-6)
    torch.testing.assert_close(OPS.rms_norm(x, w, 1e-6), expected, rtol=1e-5, atol=1e-5)
    total, normed = OPS.add_rms_norm(x, y, w, 1e-6)
    assert torch.equal(total, x + y)
    expected = torch.rms_norm(x + y, (width,), w, 1e-6)
    torch.testing.assert_close(normed, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tokens", [1, 3, 257])
def test_rope_rotates_only_the_first_heads_in_place(tokens: int) -> None:
    assert OPS is not None
    generator = torch.Generator().manual_seed(tokens)
    qkv = torch.randn(tokens, 6, 32, generator=generator)
    angles = torch.rand(tokens, 16, generator=generator) * 6.3
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    rotated = qkv.clone()
    OPS.rope_(rotated, cos, sin, 4)
    torch.testing.assert_close(rotated[:, :4], apply_rope(qkv[:, :4], cos, sin))
    assert torch.equal(rotated[:, 4:], qkv[:, 4:])  # v heads untouched


@pytest.mark.parametrize("rows", [0, 1, 7, 300])
def test_silu_mul_matches_torch_over_the_whole_float_range(rows: int) -> None:
    assert OPS is not None
    generator = torch.Generator().manual_seed(rows)
    gate_up = torch.randn(rows, 2, 2 * 344, generator=generator) * 6  # leading dims kept
    extremes = torch.tensor([-1e4, -200.0, -88.5, -87.0, -20.0, -1e-6, 0.0, 1e-6, 20.0, 88.5, 1e4])
    if rows:
        gate_up[0, 0, : extremes.numel()] = extremes
    gate, up = gate_up.split(344, dim=-1)
    got = OPS.silu_mul(gate_up)
    assert got.shape == (rows, 2, 344)
    torch.testing.assert_close(got, F.silu(gate) * up, rtol=1e-6, atol=1e-6)


def test_bad_inputs_are_refused_with_a_clear_error() -> None:
    assert OPS is not None
    with pytest.raises(RuntimeError, match="float32 only"):
        OPS.rms_norm(torch.randn(2, 8, dtype=torch.float64), torch.randn(8), 1e-6)
    with pytest.raises(RuntimeError, match="weight does not match"):
        OPS.rms_norm(torch.randn(2, 8), torch.randn(7), 1e-6)
    with pytest.raises(RuntimeError, match="x and y must match"):
        OPS.add_rms_norm(torch.randn(2, 8), torch.randn(3, 8), torch.randn(8), 1e-6)
    with pytest.raises(RuntimeError, match="shapes"):
        OPS.rope_(torch.randn(2, 4, 8), torch.randn(3, 8), torch.randn(3, 8), 2)
    with pytest.raises(RuntimeError, match="2 \\* width"):
        OPS.silu_mul(torch.randn(2, 7))


def test_a_model_with_the_fused_ops_computes_what_torch_does(
    checkpoints: Callable[[str], Path],
) -> None:
    path = checkpoints("qwen2-gqa-bias")
    fused = load_model(path, dtype="float32", device="cpu", max_positions=64)
    plain = load_model(path, dtype="float32", device="cpu", max_positions=64, packed=False)
    assert fused.norm.ops is not None
    assert fused.layers[0].self_attn.ops is not None
    assert plain.norm.ops is None
    assert plain.layers[0].self_attn.ops is None
    assert fused.layers[0].mlp.ops is not None
    x = torch.randn(4, fused.config.hidden_size)
    torch.testing.assert_close(fused.layers[0].mlp(x), plain.layers[0].mlp(x))
    hidden = torch.randn(9, fused.config.hidden_size)
    torch.testing.assert_close(fused.compute_logits(hidden), plain.compute_logits(hidden))
