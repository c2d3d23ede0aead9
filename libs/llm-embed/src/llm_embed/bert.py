"""A BERT encoder in plain PyTorch that loads Hugging Face `BertModel` safetensors as is."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import torch
import torch.nn.functional as F  # noqa: N812 - the torch convention
from safetensors.torch import load_file
from torch import nn

# Checkpoint tensors the encoder does not use: the pooler, the MLM head, an old buffer.
_IGNORED_PREFIXES = ("pooler.", "cls.", "embeddings.position_ids")


class ModelLoadError(ValueError):
    """A checkpoint directory lacks a file or holds a model this encoder cannot run."""


@dataclass(frozen=True, slots=True)
class BertConfig:
    """The fields of a Hugging Face BERT config.json this encoder uses."""

    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_attention_heads:
            raise ModelLoadError("bert config: hidden_size must be a multiple of the head count")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Self:
        """Read a parsed config.json; ModelLoadError on an unsupported model."""
        if data.get("model_type", "bert") != "bert":
            raise ModelLoadError(f"bert config: model_type {data.get('model_type')!r} is not bert")
        if data.get("hidden_act", "gelu") != "gelu":
            raise ModelLoadError("bert config: only hidden_act 'gelu' is supported")
        if data.get("position_embedding_type", "absolute") != "absolute":
            raise ModelLoadError("bert config: only absolute position embeddings are supported")
        try:
            return cls(
                vocab_size=int(data["vocab_size"]),
                hidden_size=int(data["hidden_size"]),
                num_hidden_layers=int(data["num_hidden_layers"]),
                num_attention_heads=int(data["num_attention_heads"]),
                intermediate_size=int(data["intermediate_size"]),
                max_position_embeddings=int(data["max_position_embeddings"]),
                type_vocab_size=int(data.get("type_vocab_size", 2)),
                layer_norm_eps=float(data.get("layer_norm_eps", 1e-12)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ModelLoadError(f"bert config: missing or invalid field: {exc}") from exc

    @classmethod
    def from_file(cls, path: Path) -> Self:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"bert config: cannot read {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ModelLoadError(f"bert config: {path} is not a JSON object")
        return cls.from_dict(data)


class _Embeddings(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(c.vocab_size, c.hidden_size)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.hidden_size)
        self.token_type_embeddings = nn.Embedding(c.type_vocab_size, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        # Single-segment input: every token has type 0.
        x = self.word_embeddings(ids) + self.position_embeddings(positions)
        out: torch.Tensor = self.LayerNorm(x + self.token_type_embeddings.weight[0])
        return out


class _Dense(nn.Module):
    """A linear layer followed by residual add + LayerNorm (BERT's `*.output`)."""

    def __init__(self, c: BertConfig, in_features: int) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, c.hidden_size)
        self.LayerNorm = nn.LayerNorm(c.hidden_size, eps=c.layer_norm_eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.LayerNorm(self.dense(x) + residual)
        return out


class _SelfAttention(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.heads = c.num_attention_heads
        self.query = nn.Linear(c.hidden_size, c.hidden_size)
        self.key = nn.Linear(c.hidden_size, c.hidden_size)
        self.value = nn.Linear(c.hidden_size, c.hidden_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape
        shape = (batch, length, self.heads, hidden // self.heads)
        q, k, v = (p(x).view(shape).transpose(1, 2) for p in (self.query, self.key, self.value))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).reshape(batch, length, hidden)


class _Attention(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.self = _SelfAttention(c)
        self.output = _Dense(c, c.hidden_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.output(self.self(x, mask), x)
        return out


class _Intermediate(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(c.hidden_size, c.intermediate_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(self.dense(x))  # exact (erf) GELU, as BERT's "gelu"


class _Layer(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.attention = _Attention(c)
        self.intermediate = _Intermediate(c)
        self.output = _Dense(c, c.intermediate_size)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = self.attention(x, mask)
        out: torch.Tensor = self.output(self.intermediate(x), x)
        return out


class _Encoder(nn.Module):
    def __init__(self, c: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(_Layer(c) for _ in range(c.num_hidden_layers))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for layer in self.layer:
            x = layer(x, mask)
        return x


class BertEncoder(nn.Module):
    """BERT without the pooler; module names match Hugging Face checkpoints, so a
    BertModel safetensors file loads without renaming."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = _Embeddings(config)
        self.encoder = _Encoder(config)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Last hidden states [batch, seq, hidden] for right-padded `ids`."""
        # Boolean mask broadcast over heads and query positions: True = may attend.
        mask = attention_mask.bool()[:, None, None, :]
        return self.encoder(self.embeddings(ids), mask)  # type: ignore[no-any-return]


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of the hidden states of real tokens (padding excluded), per sequence."""
    weights = attention_mask.to(hidden.dtype).unsqueeze(-1)
    summed = (hidden * weights).sum(dim=1)
    return summed / weights.sum(dim=1).clamp(min=1e-9)


def checkpoint_state(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors of a BertModel (or BertFor* with its `bert.` prefix) this encoder loads."""
    state = {}
    for key, tensor in tensors.items():
        name = key.removeprefix("bert.")
        if not name.startswith(_IGNORED_PREFIXES):
            state[name] = tensor
    return state


def load_bert(
    directory: Path, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> BertEncoder:
    """The encoder of a Hugging Face BERT checkpoint directory (config.json +
    model.safetensors), in eval mode; ModelLoadError when a file is missing or a
    tensor does not fit."""
    config = BertConfig.from_file(directory / "config.json")
    weights_path = directory / "model.safetensors"
    if not weights_path.is_file():
        raise ModelLoadError(f"bert checkpoint: model.safetensors missing in {directory}")
    model = BertEncoder(config)
    state = checkpoint_state(load_file(str(weights_path)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ModelLoadError(
            f"bert checkpoint: weights do not match BERT: missing {missing[:3]}, "
            f"unexpected tensor {unexpected[:3]}"
        )
    return model.to(device=torch.device(device), dtype=dtype).eval()
