"""Llama-family decoder (Llama, Mistral, Qwen2 layouts) over flat tokens and a paged KV cache."""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from ..attention import AttentionMetadata, paged_attention, write_kv
from ..fused_ops import FusedOps
from .config import ModelConfig
from .rope import apply_rope, rope_tables

KVCache = tuple[torch.Tensor, torch.Tensor]


class Linear(nn.Module):
    """y = x W^T (+ b) with frozen weights loaded from a checkpoint.

    transposed=True keeps W^T contiguous ([in, out]) and multiplies x @ W^T directly: on CPU
    float32 that is 1.2-1.5x faster for layers wider than they are deep at decode batch sizes
    (docs/adr/0023); the loader chooses it.
    """

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None = None, transposed: bool = False
    ) -> None:
        super().__init__()
        self.transposed = transposed
        self.weight = nn.Parameter(
            weight.t().contiguous() if transposed else weight, requires_grad=False
        )
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None

    @property
    def out_features(self) -> int:
        return int(self.weight.shape[1 if self.transposed else 0])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.transposed:
            return F.linear(x, self.weight, self.bias)
        y = torch.matmul(x, self.weight)
        return y if self.bias is None else y + self.bias


class RMSNorm(nn.Module):
    """RMSNorm computed in float32, as the reference implementation does; one fused pass with
    `ops` (CPU float32)."""

    def __init__(self, weight: torch.Tensor, eps: float, ops: FusedOps | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)
        self.eps = eps
        self.ops = ops

    def add_and_norm(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + y, the norm of it): the residual stream and the next block's input."""
        if self.ops is not None and x.is_contiguous() and y.is_contiguous():
            return self.ops.add_rms_norm(x, y, self.weight, self.eps)
        h = x + y
        return h, self(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.ops is not None and x.is_contiguous():
            return self.ops.rms_norm(x, self.weight, self.eps)
        if x.dtype == torch.float32:
            # One fused op, bit-identical to the explicit form below in float32.
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


class Attention(nn.Module):
    """Fused q/k/v projection, RoPE, paged attention and output projection."""

    def __init__(
        self, config: ModelConfig, qkv: nn.Module, o_proj: nn.Module, ops: FusedOps | None = None
    ) -> None:
        super().__init__()
        self.ops = ops
        self.qkv_proj = qkv
        self.o_proj = o_proj
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        tokens = x.shape[0]
        qkv = self.qkv_proj(x).view(tokens, -1, self.head_dim)
        heads, kv_heads = self.num_heads, self.num_kv_heads
        # q and k are adjacent heads of the fused output: rotate them in one pass.
        if self.ops is not None and qkv.is_contiguous():
            self.ops.rope_(qkv, cos.contiguous(), sin.contiguous(), heads + kv_heads)
            qk = qkv[:, : heads + kv_heads]
        else:
            qk = apply_rope(qkv[:, : heads + kv_heads], cos, sin)
        q, k = qk[:, :heads], qk[:, heads:]
        v = qkv[:, heads + kv_heads :]
        k_cache, v_cache = kv_cache
        write_kv(k_cache, v_cache, k, v, meta.write_index)
        out = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale)
        result: torch.Tensor = self.o_proj(out)
        return result


class MLP(nn.Module):
    """SwiGLU with the gate and up projections fused into one matmul (activates: that module
    also applies silu(gate) * up, the packed CPU kernel's PackedSwiGLU)."""

    def __init__(
        self,
        gate_up: nn.Module,
        down: nn.Module,
        intermediate: int,
        ops: FusedOps | None = None,
        activates: bool = False,
    ) -> None:
        super().__init__()
        self.ops = ops
        self.gate_up_proj = gate_up
        self.down_proj = down
        self.intermediate = intermediate
        self.activates = activates

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        projected = self.gate_up_proj(x)
        if self.activates:
            activated = projected
        elif self.ops is not None and projected.is_contiguous():
            activated = self.ops.silu_mul(projected)
        else:
            gate, up = projected.split(self.intermediate, dim=-1)
            activated = F.silu(gate) * up
        result: torch.Tensor = self.down_proj(activated)
        return result


class DecoderLayer(nn.Module):
    """Pre-norm attention block followed by a pre-norm MLP block, both residual."""

    def __init__(self, attn: Attention, mlp: MLP, input_norm: RMSNorm, post_norm: RMSNorm) -> None:
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp
        self.input_layernorm = input_norm
        self.post_attention_layernorm = post_norm

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        attended = self.self_attn(self.input_layernorm(x), cos, sin, kv_cache, meta)
        h, normed = self.post_attention_layernorm.add_and_norm(x, attended)
        result: torch.Tensor = h + self.mlp(normed)
        return result


class LlamaModel(nn.Module):
    """Embedding, decoder layers, final norm and LM head; forward runs one engine step."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(
        self,
        config: ModelConfig,
        embed: torch.Tensor,
        layers: list[DecoderLayer],
        norm: RMSNorm,
        lm_head: nn.Module,
        max_positions: int,
    ) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Parameter(embed, requires_grad=False)
        self.layers = nn.ModuleList(layers)
        self.norm = norm
        self.lm_head = lm_head
        cos, sin = rope_tables(
            config.rope, config.head_dim, max_positions, config.max_position_embeddings
        )
        self.register_buffer("rope_cos", cos.to(embed.device), persistent=False)
        self.register_buffer("rope_sin", sin.to(embed.device), persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.dtype

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Hidden states [tokens, hidden] (before the final norm) for a flat batch of tokens."""
        x = F.embedding(input_ids, self.embed_tokens)
        cos = self.rope_cos.index_select(0, positions).to(x.dtype)
        sin = self.rope_sin.index_select(0, positions).to(x.dtype)
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer(x, cos, sin, kv_cache, meta)
        return x

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 logits [rows, vocab] for selected hidden rows."""
        logits: torch.Tensor = self.lm_head(self.norm(hidden))
        return logits.float()
