"""The per-layer small operations of a CPU float32 step in one pass each (csrc/fused_ops.cpp):
RMSNorm, residual add + RMSNorm, RoPE in place, and SwiGLU's silu(gate) * up. torch dispatches
each as several ops (RMSNorm ~12 us a call at one row, RoPE six, SwiGLU three passes), which at
decode batch sizes costs more than the arithmetic. The model modules take these when the loader
gives them (CPU float32, the kernel builds here) and fall back to torch otherwise.
"""

from __future__ import annotations

from typing import Protocol

import torch

from .cpu_ext import load_extension


class FusedOps(Protocol):
    def rms_norm(self, x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm over the last dimension: w * (x / sqrt(mean(x^2) + eps))."""

    def add_rms_norm(
        self, x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + y, rms_norm(x + y))."""

    def rope_(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int) -> None:
        """Rotate heads [0, heads) of qkv [tokens, all heads, dim] in place (rotate-half)."""

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for gate_up [..., 2 * width] (gate first) -> [..., width]."""


def load_fused_ops() -> FusedOps | None:
    """The compiled operations, or None when they cannot be built here."""
    return load_extension("llm_fused_ops_v4", "fused_ops.cpp", "fused CPU ops")
