"""Weight-only int8 quantization with symmetric per-output-channel scales."""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

INT8_MAX = 127


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 weight [out, in] and float32 scales [out] with weight ≈ q * scale[:, None]."""
    w = weight.float()
    scale = w.abs().amax(dim=1).clamp(min=1e-8) / INT8_MAX
    q = torch.round(w / scale[:, None]).clamp(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


class Int8Linear(nn.Module):
    """Linear layer holding int8 weights; activations stay in the model dtype."""

    qweight: torch.Tensor
    scale: torch.Tensor

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype) -> None:
        super().__init__()
        q, scale = quantize_per_channel(weight)
        self.register_buffer("qweight", q)
        self.register_buffer("scale", scale.to(dtype))
        self.bias = nn.Parameter(bias.to(dtype), requires_grad=False) if bias is not None else None
        # On CUDA the fused int8 kernel reads 1 byte per weight; on CPU it is slower than
        # dequantising into the matmul, so the CPU path trades speed parity for memory only.
        self._fused = weight.device.type == "cuda" and _fused_kernel_works(q, self.scale, dtype)

    @property
    def out_features(self) -> int:
        return int(self.qweight.shape[0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        qweight, scale = self.qweight, self.scale
        if self._fused:
            flat = x.reshape(-1, x.shape[-1])
            y = torch._weight_int8pack_mm(flat, qweight, scale).view(*x.shape[:-1], -1)
        else:
            y = F.linear(x, qweight.to(x.dtype)) * scale
        if self.bias is not None:
            y = y + self.bias
        return y


def _fused_kernel_works(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> bool:
    """Probe the fused int8 matmul once (its shape and dtype support varies by build)."""
    try:
        probe = torch.zeros(1, q.shape[1], dtype=dtype, device=q.device)
        torch._weight_int8pack_mm(probe, q, scale)
    except RuntimeError:
        return False
    return True
