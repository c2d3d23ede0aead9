"""Paged KV cache storage: one K and one V tensor per layer, sized from a memory budget."""

from __future__ import annotations

import torch

from .models.config import ModelConfig

KVCache = tuple[torch.Tensor, torch.Tensor]


def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Memory of one block across all layers, keys and values."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_layers * block_size * config.num_kv_heads * config.head_dim * element


def num_blocks_for_budget(
    config: ModelConfig, block_size: int, dtype: torch.dtype, budget_bytes: int
) -> int:
    return budget_bytes // bytes_per_block(config, block_size, dtype)


def allocate_kv_cache(
    config: ModelConfig, num_blocks: int, block_size: int, dtype: torch.dtype, device: torch.device
) -> list[KVCache]:
    """Per-layer (K, V) tensors of shape [num_blocks, kv_heads, block_size, head_dim]."""
    shape = (num_blocks, config.num_kv_heads, block_size, config.head_dim)
    return [
        (
            torch.zeros(shape, dtype=dtype, device=device),
            torch.zeros(shape, dtype=dtype, device=device),
        )
        for _ in range(config.num_layers)
    ]
