"""Rotary position embeddings: cos/sin tables for default, linear, dynamic, llama3 and yarn RoPE."""

from __future__ import annotations

import math

import torch

from .config import RopeConfig


def rope_tables(
    rope: RopeConfig, head_dim: int, max_positions: int, trained_positions: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos and sin tables [max_positions, head_dim] (halves repeated, HF layout)."""
    positions = torch.arange(max_positions, dtype=torch.float32)
    scale = 1.0
    if rope.rope_type == "dynamic":
        freqs = _dynamic_freqs(rope, head_dim, positions, trained_positions)
    else:
        inv_freq, scale = _inv_freq(rope, head_dim, trained_positions)
        freqs = positions[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * scale, emb.sin() * scale


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [tokens, heads, head_dim] by per-token cos/sin [tokens, head_dim] (rotate-half)."""
    cos = cos[:, None, :]
    sin = sin[:, None, :]
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return x * cos + rotated * sin


def _base_inv_freq(theta: float, dim: int) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    return 1.0 / (theta**exponents)


def _inv_freq(rope: RopeConfig, dim: int, trained_positions: int) -> tuple[torch.Tensor, float]:
    inv_freq = _base_inv_freq(rope.theta, dim)
    if rope.rope_type == "linear":
        return inv_freq / rope.factor, 1.0
    if rope.rope_type == "llama3":
        return _llama3(rope, inv_freq, trained_positions), 1.0
    if rope.rope_type == "yarn":
        return _yarn(rope, dim, trained_positions)
    return inv_freq, 1.0


def _dynamic_freqs(
    rope: RopeConfig, dim: int, positions: torch.Tensor, trained_positions: int
) -> torch.Tensor:
    # HF rescales the base from the length of the whole forward pass, which a KV cache cannot
    # honour; here each position uses the base for a sequence ending at it. Within the trained
    # length that is exactly the default table, as in HF.
    inv_freq = _base_inv_freq(rope.theta, dim)
    freqs = positions[:, None] * inv_freq[None, :]
    beyond = positions >= trained_positions
    if bool(beyond.any()):
        seq_len = positions[beyond] + 1
        ratio = rope.factor * seq_len / trained_positions - (rope.factor - 1)
        base = rope.theta * ratio ** (dim / (dim - 2))
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
        scaled_inv = 1.0 / (base[:, None] ** exponents[None, :])
        freqs[beyond] = positions[beyond][:, None] * scaled_inv
    return freqs


def _llama3(rope: RopeConfig, inv_freq: torch.Tensor, trained_positions: int) -> torch.Tensor:
    old_context = rope.original_max_position or trained_positions
    low_wavelen = old_context / rope.low_freq_factor
    high_wavelen = old_context / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_context / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(rope: RopeConfig, dim: int, trained_positions: int) -> tuple[torch.Tensor, float]:
    original = rope.original_max_position or trained_positions
    factor = rope.factor
    attention_factor = rope.attention_factor
    if attention_factor is None:
        attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(rope.theta))

    low = float(max(math.floor(correction_dim(rope.beta_fast)), 0))
    high = float(min(math.ceil(correction_dim(rope.beta_slow)), dim - 1))
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (factor * pos_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_weight = 1 - ramp
    inv_freq = interpolation * (1 - extrapolation_weight) + extrapolation * extrapolation_weight
    return inv_freq, float(attention_factor)
