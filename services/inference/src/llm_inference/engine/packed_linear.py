"""Linear layers for CPU float32 with weights packed in panels (csrc/packed_linear.cpp).

BLAS packs the weight matrix on every call, which dominates at the rows of a decode step: at 16
rows MKL reached ~50 GFLOP/s on a 1024x5632 layer here, the packed kernel ~130 (2-3x), and it
stays 1.3-2x ahead up to 2,048-row prefill chunks (docs/adr/0024). Packing once at load time
costs no memory beyond padding the last panel.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from .cpu_ext import load_extension


class PackedKernel(Protocol):
    def packed_linear(self, x: torch.Tensor, packed: torch.Tensor, n_out: int) -> torch.Tensor:
        """x [M, K] @ W^T -> [M, n_out]."""

    def packed_swiglu(self, x: torch.Tensor, packed: torch.Tensor, n_out: int) -> torch.Tensor:
        """silu(x @ G^T) * (x @ U^T) -> [M, n_out], G and U packed by pack_pairs."""

    def panel_width(self) -> int:
        """Output columns per panel (64 with AVX-512, 32 with AVX2)."""


def load_packed_kernel() -> PackedKernel | None:
    """The compiled kernel, or None when it cannot be built here."""
    module = load_extension("llm_packed_linear_v5", "packed_linear.cpp", "packed linear kernel")
    return module  # a module: its attributes satisfy the protocol structurally


def pack(weight: torch.Tensor, panel: int) -> torch.Tensor:
    """W [N, K] -> panels [ceil(N / panel), K, panel]: packed[p, k, j] = W[p * panel + j, k]."""
    n_out, k_len = weight.shape
    panels = -(-n_out // panel)
    padded = torch.zeros(panels * panel, k_len, dtype=weight.dtype, device=weight.device)
    padded[:n_out] = weight
    return padded.view(panels, panel, k_len).transpose(1, 2).contiguous()


def pack_pairs(gate: torch.Tensor, up: torch.Tensor, panel: int) -> torch.Tensor:
    """G, U [N, K] -> panels [ceil(N / half), K, panel], half = panel / 2: panel p holds G's rows
    [p * half, p * half + half) in its first half of columns and U's same rows in the second,
    so one tile has both inputs of silu(g) * u for its outputs."""
    half = panel // 2
    gate_panels, up_panels = pack(gate, half), pack(up, half)
    return torch.cat([gate_panels, up_panels], dim=2).contiguous()


class PackedLinear(nn.Module):
    """y = x W^T (+ b) through the packed kernel; x [..., K] float32 on CPU."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, kernel: PackedKernel
    ) -> None:
        super().__init__()
        self._kernel = kernel
        self.out_features = int(weight.shape[0])
        self.packed = nn.Parameter(pack(weight, kernel.panel_width()), requires_grad=False)
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        y = self._kernel.packed_linear(rows, self.packed, self.out_features)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)


class PackedSwiGLU(nn.Module):
    """silu(x G^T) * (x U^T) in one kernel call: the gate and up projections' outputs are
    never written out (at a 2,048-token prefill chunk they are twice the activation's size)."""

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, kernel: PackedKernel) -> None:
        super().__init__()
        self._kernel = kernel
        self.out_features = int(gate.shape[0])
        self.packed = nn.Parameter(pack_pairs(gate, up, kernel.panel_width()), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1]).contiguous()
        y = self._kernel.packed_swiglu(rows, self.packed, self.out_features)
        return y.view(*x.shape[:-1], self.out_features)
