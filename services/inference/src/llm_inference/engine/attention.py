"""Attention over the paged KV cache in plain PyTorch: scatter new K/V into blocks, gather by table.

The cache of a layer is [num_blocks, kv_heads, block_size, head_dim]; viewed as rows of
[block_size, head_dim] indexed by `block * kv_heads + head`, one index_select yields contiguous
[rows, heads, context, head_dim] keys, which is what SDPA reads fastest on CPU.

Tokens of one step are laid out flat: first the single-token rows (decodes), batched into groups
with a padding mask, then each multi-token span (a prefill chunk) with its own causal mask.

With the paged kernel (paged_kernel.py; CPU, float32) nothing is gathered: one call attends
over every row's blocks in place through the block tables, decode rows and prefill chunks alike
(a chunk's row i sees its first start + i + 1 keys, so causal needs no mask; docs/adr, "paged
decode").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812

from .paged_kernel import PagedDecodeFn

# Largest attention score matrix (heads x queries x keys) materialised at once on CPU.
CPU_SCORE_ELEMENTS = 1 << 22


@dataclass(frozen=True, slots=True)
class PrefillSpan:
    """Query rows [start, start+length) attending to the first context_len keys of their seq."""

    start: int
    length: int
    context_len: int
    gather_index: torch.Tensor | None  # [kv_heads * blocks] rows; None: keys are the step's own
    mask: torch.Tensor | None  # additive [length, context_len]; None: causal from position 0


@dataclass(frozen=True, slots=True)
class DecodeGroup:
    """Single-token rows [start, start+size) sharing one padded gather of their blocks."""

    start: int
    size: int
    gather_index: torch.Tensor  # [size * kv_heads * max_blocks] rows
    mask: torch.Tensor  # additive [size, 1, 1, max_blocks * block_size]


@dataclass(frozen=True, slots=True)
class PagedDecode:
    """Query rows [start, start+size) attended in place by the paged kernel."""

    start: int
    size: int
    tables: torch.Tensor  # [seqs, max_blocks] int64 block ids (0-padded past each seq's end)
    table_rows: torch.Tensor  # [size] int64: the tables row of each query row
    lens: torch.Tensor  # [size] int64 keys per row
    kernel: PagedDecodeFn


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    """Everything a layer needs to run attention for one step (shared by all layers)."""

    write_index: torch.Tensor  # [tokens * kv_heads] flat [block, head, offset] slot of each new K/V
    decode_groups: tuple[DecodeGroup, ...]
    prefills: tuple[PrefillSpan, ...]
    # Reused gather buffers [rows, block_size, head_dim] for keys and values: filling a warm
    # buffer is a third faster on CPU than allocating (and page-faulting) a fresh one per call.
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None
    paged: PagedDecode | None = None  # decode rows for the paged kernel (then no decode_groups)


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    write_index: torch.Tensor,
) -> None:
    """Store the step's keys and values [tokens, kv_heads, head_dim] in their blocks."""
    head_dim = k.shape[-1]
    k_cache.view(-1, head_dim).index_copy_(0, write_index, k.reshape(-1, head_dim))
    v_cache.view(-1, head_dim).index_copy_(0, write_index, v.reshape(-1, head_dim))


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Attention output [tokens, heads * head_dim] for queries q [tokens, heads, head_dim].

    The step's k/v must already be in the cache (write_kv).
    """
    tokens, heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    out = q.new_empty(tokens, heads, head_dim)
    k_space, v_space = meta.workspace if meta.workspace is not None else (None, None)
    if meta.paged is not None:
        p = meta.paged
        rows = slice(p.start, p.start + p.size)
        q_rows = q[rows].contiguous()
        out[rows] = p.kernel(q_rows, k_cache, v_cache, p.tables, p.table_rows, p.lens, scale)
    for group in meta.decode_groups:
        rows = slice(group.start, group.start + group.size)
        keys = _gather(k_cache, group.gather_index, group.size, kv_heads, k_space)
        values = _gather(v_cache, group.gather_index, group.size, kv_heads, v_space)
        out[rows] = _decode(q[rows], keys, values, group.mask, scale)
    for span in meta.prefills:
        rows = slice(span.start, span.start + span.length)
        if span.gather_index is None:
            keys, values = k[rows].transpose(0, 1), v[rows].transpose(0, 1)
        else:
            ctx = span.context_len
            keys = _gather(k_cache, span.gather_index, 1, kv_heads, k_space)[0, :, :ctx]
            values = _gather(v_cache, span.gather_index, 1, kv_heads, v_space)[0, :, :ctx]
        out[rows] = _prefill(q[rows], keys, values, span, scale)
    return out.view(tokens, heads * head_dim)


def _gather(
    cache: torch.Tensor,
    index: torch.Tensor,
    rows: int,
    heads: int,
    workspace: torch.Tensor | None,
) -> torch.Tensor:
    """Contiguous [rows, heads, blocks * block_size, head_dim] from block-row indices."""
    block_size, head_dim = cache.shape[2], cache.shape[3]
    flat = cache.view(-1, block_size, head_dim)
    count = index.shape[0]
    if workspace is not None and workspace.shape[0] >= count:
        picked = torch.index_select(flat, 0, index, out=workspace[:count])
    else:
        picked = flat.index_select(0, index)
    return picked.view(rows, heads, -1, head_dim)


def _decode(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, scale: float
) -> torch.Tensor:
    rows, heads, head_dim = q.shape
    kv_heads = keys.shape[1]
    # Heads sharing a KV head become the query rows of that head: GQA without repeating K/V.
    group = heads // kv_heads
    if q.device.type != "cpu":
        q4 = q.view(rows, kv_heads, group, head_dim)
        out = F.scaled_dot_product_attention(q4, keys, values, attn_mask=mask, scale=scale)
        return out.reshape(rows, heads, head_dim)
    ctx = keys.shape[2]
    flat_q = q.reshape(rows * kv_heads, group, head_dim)
    scores = torch.bmm(flat_q, keys.view(rows * kv_heads, ctx, head_dim).transpose(1, 2))
    scores = scores.view(rows, kv_heads, group, ctx).mul_(scale).add_(mask)
    probs = torch.softmax(scores, dim=-1).view(rows * kv_heads, group, ctx)
    out = torch.bmm(probs, values.view(rows * kv_heads, ctx, head_dim))
    return out.view(rows, heads, head_dim)


def _prefill(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, span: PrefillSpan, scale: float
) -> torch.Tensor:
    """q [length, heads, head_dim] over keys/values [kv_heads, context, head_dim]."""
    if q.device.type == "cpu":
        return _cpu_attention(q, keys, values, span, scale)
    heads, kv_heads = q.shape[1], keys.shape[0]
    if heads != kv_heads:
        keys = keys.repeat_interleave(heads // kv_heads, dim=0)
        values = values.repeat_interleave(heads // kv_heads, dim=0)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        keys,
        values,
        attn_mask=span.mask,
        is_causal=span.mask is None,
        scale=scale,
    )
    return out.transpose(0, 1)


def _cpu_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, span: PrefillSpan, scale: float
) -> torch.Tensor:
    """Causal attention as bmm + softmax + bmm, in query chunks that bound the score memory.

    On CPU this is ~3x faster than SDPA's flash kernel at small head sizes. Query heads that
    share a KV head are stacked as rows of one matmul, so K/V are never repeated.
    """
    length, heads, head_dim = q.shape
    kv_heads, ctx, _ = keys.shape
    group = heads // kv_heads
    # [kv_heads, group, length, head_dim]: the query rows served by each KV head.
    grouped = q.view(length, kv_heads, group, head_dim).permute(1, 2, 0, 3)
    keys_t = keys.transpose(1, 2)
    offset = ctx - length  # query i sits at position offset + i
    key_pos = torch.arange(ctx, device=q.device)
    rows = max(1, CPU_SCORE_ELEMENTS // (heads * ctx))
    out = q.new_empty(kv_heads, group, length, head_dim)
    for start in range(0, length, rows):
        stop = min(start + rows, length)
        n = stop - start
        if span.mask is not None:
            mask = span.mask[start:stop]
        else:
            query_pos = torch.arange(offset + start, offset + stop, device=q.device)
            mask = torch.zeros(n, ctx, dtype=q.dtype, device=q.device)
            mask.masked_fill_(key_pos[None, :] > query_pos[:, None], float("-inf"))
        chunk = grouped[:, :, start:stop].reshape(kv_heads, group * n, head_dim)
        scores = torch.bmm(chunk, keys_t).view(kv_heads, group, n, ctx)
        scores.mul_(scale).add_(mask)
        probs = torch.softmax(scores, dim=-1).view(kv_heads, group * n, ctx)
        out[:, :, start:stop] = torch.bmm(probs, values).view(kv_heads, group, n, head_dim)
    return out.permute(2, 0, 1, 3).reshape(length, heads, head_dim)
