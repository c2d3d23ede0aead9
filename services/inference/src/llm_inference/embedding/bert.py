"""A BERT encoder in plain PyTorch, loading Hugging Face `BertModel` safetensors."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import torch
import torch.nn.functional as F  # noqa: N812 - the conventional alias
from safetensors.torch import load_file
from torch import nn

from llm_common.config import ConfigError

# HF key fragment -> this module's, applied in order; layer-level keys are below.
_EMBEDDING_KEYS = {
    "embeddings.word_embeddings.": "embeddings.words.",
    "embeddings.position_embeddings.": "embeddings.positions.",
    "embeddings.token_type_embeddings.": "embeddings.token_types.",
    "embeddings.LayerNorm.": "embeddings.norm.",
}
_LAYER_KEYS = {
    "attention.self.query.": "query.",
    "attention.self.key.": "key.",
    "attention.self.value.": "value.",
    "attention.output.dense.": "attn_out.",
    "attention.output.LayerNorm.": "attn_norm.",
    "intermediate.dense.": "ffn_in.",
    "output.dense.": "ffn_out.",
    "output.LayerNorm.": "ffn_norm.",
}
_IGNORED_PREFIXES = ("pooler.", "embeddings.position_ids", "cls.")


@dataclass(frozen=True, slots=True)
class BertConfig:
    """The fields of a BERT config.json this encoder uses."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ConfigError("bert config: hidden_size must be a multiple of num_attention_heads")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Self:
        if data.get("model_type", "bert") != "bert":
            raise ConfigError(f"bert config: model_type {data.get('model_type')!r} is not bert")
        if data.get("hidden_act", "gelu") != "gelu":
            raise ConfigError("bert config: only hidden_act 'gelu' is supported")
        try:
            return cls(
                vocab_size=int(data["vocab_size"]),
                hidden_size=int(data["hidden_size"]),
                num_layers=int(data["num_hidden_layers"]),
                num_heads=int(data["num_attention_heads"]),
                intermediate_size=int(data["intermediate_size"]),
                max_position_embeddings=int(data["max_position_embeddings"]),
                type_vocab_size=int(data.get("type_vocab_size", 2)),
                layer_norm_eps=float(data.get("layer_norm_eps", 1e-12)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"bert config: missing or invalid field: {exc}") from exc

    @classmethod
    def from_file(cls, path: Path) -> Self:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ConfigError(f"bert config: cannot read {path}: {exc}") from exc
        return cls.from_dict(data)


class Embeddings(nn.Module):
    """Word + absolute position + token type embeddings, then LayerNorm."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.words = nn.Embedding(config.vocab_size, config.hidden_size)
        self.positions = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_types = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        # Single-segment inputs: every token has type 0.
        hidden = self.words(input_ids) + self.positions(positions) + self.token_types.weight[0]
        out: torch.Tensor = self.norm(hidden)
        return out


class EncoderLayer(nn.Module):
    """Post-norm self-attention and GELU feed-forward, as in the original BERT."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)
        self.ffn_in = nn.Linear(hidden, config.intermediate_size)
        self.ffn_out = nn.Linear(config.intermediate_size, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        attended = self.attn_out(self._attention(x, mask))
        x = self.attn_norm(x + attended)
        out: torch.Tensor = self.ffn_norm(x + self.ffn_out(F.gelu(self.ffn_in(x))))
        return out

    def _attention(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, length, hidden = x.shape
        head_dim = hidden // self.num_heads

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.num_heads, head_dim).transpose(1, 2)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=1.0 / math.sqrt(head_dim)
        )
        return out.transpose(1, 2).reshape(batch, length, hidden)


class BertEncoder(nn.Module):
    """Token ids + attention mask -> last hidden states [batch, length, hidden]."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = Embeddings(config)
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.num_layers))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # Boolean [batch, 1, 1, length]: every query may attend to the real (unpadded) keys.
        mask = attention_mask.bool()[:, None, None, :]
        x: torch.Tensor = self.embeddings(input_ids)
        for layer in self.layers:
            x = layer(x, mask)
        return x


def mean_pool(hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean of the hidden states of real tokens (padding excluded), per sequence."""
    weights = attention_mask.to(hidden.dtype).unsqueeze(-1)
    summed = (hidden * weights).sum(dim=1)
    return summed / weights.sum(dim=1).clamp(min=1e-9)


def rename_key(key: str) -> str | None:
    """This module's parameter name for an HF BertModel key; None for unused tensors."""
    key = key.removeprefix("bert.")
    if key.startswith(_IGNORED_PREFIXES):
        return None
    for hf, ours in _EMBEDDING_KEYS.items():
        if key.startswith(hf):
            return ours + key[len(hf) :]
    if key.startswith("encoder.layer."):
        index, _, rest = key[len("encoder.layer.") :].partition(".")
        for hf, ours in _LAYER_KEYS.items():
            if rest.startswith(hf):
                return f"layers.{index}.{ours}{rest[len(hf) :]}"
    raise ConfigError(f"bert checkpoint: unexpected tensor {key!r}")


def load_encoder(directory: Path, *, dtype: torch.dtype, device: torch.device) -> BertEncoder:
    """The encoder of an HF BERT checkpoint directory (config.json + model.safetensors)."""
    config = BertConfig.from_file(directory / "config.json")
    weights_path = directory / "model.safetensors"
    if not weights_path.is_file():
        raise ConfigError(f"bert checkpoint: {weights_path} not found")
    state = {}
    for key, tensor in load_file(str(weights_path)).items():
        name = rename_key(key)
        if name is not None:
            state[name] = tensor
    model = BertEncoder(config)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ConfigError(f"bert checkpoint: missing {missing}, unexpected {unexpected}")
    return model.to(device=device, dtype=dtype).eval()
