"""Memory-bandwidth roofline for decode steps.

A decode step reads every weight once and the whole KV cache of the batch; at batch sizes where
the step is memory-bound its floor is (weight bytes + KV bytes) / copy bandwidth. Bandwidth is
measured, not taken from a datasheet: a large device-to-device tensor copy (bytes read + bytes
written per copy), timed with CUDA events on a GPU and perf_counter on CPU.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from gpu.model import ModelShape

BF16_BYTES = 2


@dataclass(frozen=True, slots=True)
class Bandwidth:
    bytes_per_s: float
    buffer_bytes: int
    repeats: int


def copy_bandwidth(device: str, buffer_bytes: int, repeats: int = 20) -> Bandwidth:
    src = torch.ones(buffer_bytes // BF16_BYTES, dtype=torch.bfloat16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # warm-up: allocation, first-touch
    if device.startswith("cuda"):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        torch.cuda.synchronize()
        start.record()
        for _ in range(repeats):
            dst.copy_(src)
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3
    else:
        began = time.perf_counter()
        for _ in range(repeats):
            dst.copy_(src)
        seconds = time.perf_counter() - began
    moved = 2 * src.numel() * BF16_BYTES * repeats  # each copy reads and writes the buffer
    return Bandwidth(moved / seconds, src.numel() * BF16_BYTES, repeats)


def step_roofline(
    shape: ModelShape, batch: int, mean_context: float, bandwidth: Bandwidth, step_ms: float
) -> dict[str, Any]:
    """Bytes one decode step must read, the time the measured bandwidth needs for them, and the
    measured step against it (efficiency 1.0 = at the roofline)."""
    weights = shape.weight_bytes_per_step(BF16_BYTES)
    kv = int(shape.kv_bytes_per_token(BF16_BYTES) * batch * mean_context)
    floor_ms = (weights + kv) / bandwidth.bytes_per_s * 1e3
    return {
        "weight_bytes": weights,
        "kv_bytes": kv,
        "mean_context_tokens": mean_context,
        "roofline_step_ms": floor_ms,
        "measured_step_ms": step_ms,
        "efficiency": floor_ms / step_ms if step_ms > 0 else 0.0,
    }
