"""The packed CPU linear kernel (csrc/packed_linear.cpp) against torch's matmul: every row
count a step can have, output widths that do not fill the last panel, odd inner sizes, bias,
and clear errors for inputs it does not take."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F  # noqa: N812

from llm_inference.engine.fused_ops import load_fused_ops
from llm_inference.engine.packed_linear import (
    PackedLinear,
    PackedSwiGLU,
    load_packed_kernel,
    pack,
    pack_pairs,
)

KERNEL = load_packed_kernel()
pytestmark = pytest.mark.skipif(KERNEL is None, reason="no C++ toolchain for the kernel")


@pytest.mark.parametrize("rows", [0, 1, 2, 5, 6, 7, 16, 33, 130])
@pytest.mark.parametrize(("k_len", "n_out"), [(64, 192), (96, 64), (37, 100), (128, 1)])
def test_matches_torch_linear(rows: int, k_len: int, n_out: int) -> None:
    assert KERNEL is not None
    generator = torch.Generator().manual_seed(rows * 1000 + k_len + n_out)
    weight = torch.randn(n_out, k_len, generator=generator)
    bias = torch.randn(n_out, generator=generator)
    x = torch.randn(rows, k_len, generator=generator)
    layer = PackedLinear(weight, bias, KERNEL)
    assert layer.out_features == n_out
    torch.testing.assert_close(layer(x), F.linear(x, weight, bias), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("rows", [0, 1, 5, 6, 7, 33, 130])
@pytest.mark.parametrize(("k_len", "n_out"), [(64, 96), (37, 100), (128, 1), (16, 32)])
def test_swiglu_in_the_kernel_equals_projection_then_activation(
    rows: int, k_len: int, n_out: int
) -> None:
    """Bit for bit the packed gate/up projection followed by the fused ops' silu_mul (same
    products in the same order, same silu), and torch's SwiGLU within float32 rounding."""
    ops = load_fused_ops()
    assert KERNEL is not None
    assert ops is not None
    generator = torch.Generator().manual_seed(rows * 100 + k_len + n_out)
    gate, up = torch.randn(2, n_out, k_len, generator=generator)
    x = torch.randn(rows, k_len, generator=generator)
    fused = PackedSwiGLU(gate, up, KERNEL)
    assert fused.out_features == n_out
    two_steps = ops.silu_mul(PackedLinear(torch.cat([gate, up]), None, KERNEL)(x))
    assert torch.equal(fused(x), two_steps)
    torch.testing.assert_close(fused(x), F.silu(x @ gate.T) * (x @ up.T), rtol=1e-5, atol=1e-4)


def test_layers_large_enough_to_thread_match_torch() -> None:
    """Big enough that the panels are split between threads (work_split.h): same results."""
    assert KERNEL is not None
    generator = torch.Generator().manual_seed(7)
    gate, up = torch.randn(2, 1000, 1024, generator=generator)
    x = torch.randn(64, 1024, generator=generator)
    torch.testing.assert_close(
        PackedLinear(gate, None, KERNEL)(x), x @ gate.T, rtol=1e-5, atol=1e-3
    )
    torch.testing.assert_close(
        PackedSwiGLU(gate, up, KERNEL)(x), F.silu(x @ gate.T) * (x @ up.T), rtol=1e-4, atol=1e-2
    )


def test_pairs_share_a_panel_half_and_half() -> None:
    assert KERNEL is not None
    panel = KERNEL.panel_width()
    half = panel // 2
    gate = torch.arange(3 * 4, dtype=torch.float32).view(3, 4)
    packed = pack_pairs(gate, -gate, panel)
    assert packed.shape == (1, 4, panel)
    torch.testing.assert_close(packed[0, :, :3], gate.T)
    torch.testing.assert_close(packed[0, :, half : half + 3], -gate.T)
    assert bool((packed[0, :, 3:half] == 0).all())
    assert bool((packed[0, :, half + 3 :] == 0).all())


def test_leading_dimensions_and_non_contiguous_input() -> None:
    assert KERNEL is not None
    weight = torch.randn(70, 48)
    layer = PackedLinear(weight, None, KERNEL)
    x = torch.randn(48, 2, 3).permute(1, 2, 0)  # [2, 3, 48], not contiguous
    torch.testing.assert_close(layer(x), x @ weight.T, rtol=1e-5, atol=1e-4)


def test_packing_pads_the_last_panel_with_zeros() -> None:
    assert KERNEL is not None
    panel = KERNEL.panel_width()
    weight = torch.arange(3 * 5, dtype=torch.float32).view(3, 5)
    packed = pack(weight, panel)
    assert packed.shape == (1, 5, panel)
    torch.testing.assert_close(packed[0, :, :3], weight.T)
    assert bool((packed[0, :, 3:] == 0).all())


def test_bad_inputs_are_refused_with_a_clear_error() -> None:
    assert KERNEL is not None
    packed = pack(torch.randn(8, 16), KERNEL.panel_width())
    with pytest.raises(RuntimeError, match="float32 only"):
        KERNEL.packed_linear(torch.randn(2, 16, dtype=torch.float64), packed, 8)
    with pytest.raises(RuntimeError, match="shapes disagree"):
        KERNEL.packed_linear(torch.randn(2, 15), packed, 8)
    with pytest.raises(RuntimeError, match="shapes disagree"):
        KERNEL.packed_linear(torch.randn(2, 16), packed, KERNEL.panel_width() + 1)
    with pytest.raises(RuntimeError, match="packed_swiglu: shapes disagree"):
        KERNEL.packed_swiglu(torch.randn(2, 16), packed, KERNEL.panel_width() // 2 + 1)
