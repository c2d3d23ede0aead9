"""Paged KV cache storage: one K and one V tensor per layer, sized from a memory budget."""

from __future__ import annotations

import numpy as np
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


def cache_rows(tables: np.ndarray, kv_heads: int) -> np.ndarray:
    """Flat cache-row indices [..., kv_heads, blocks] of block tables [..., blocks]: a layer's
    cache viewed as rows of [block_size, head_dim], row = block * kv_heads + head."""
    heads = np.arange(kv_heads, dtype=np.int64)
    rows: np.ndarray = tables[..., None, :] * kv_heads + heads[:, None]
    return rows


def write_slots(
    blocks: np.ndarray, offsets: np.ndarray, kv_heads: int, block_size: int
) -> np.ndarray:
    """Flat [block, head, offset] slots [tokens * kv_heads] for tokens at (block, offset)."""
    heads = np.arange(kv_heads, dtype=np.int64)
    rows = blocks[:, None] * kv_heads + heads[None, :]
    slots: np.ndarray = (rows * block_size + offsets[:, None]).reshape(-1)
    return slots
