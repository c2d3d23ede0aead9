"""ModelConfig: architecture facts from a Hugging Face config.json (Llama, Mistral, Qwen2)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..api import EngineError

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


class CheckpointError(EngineError):
    """The checkpoint directory is missing files or describes an unsupported model."""


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """Rotary embedding parameters: base, scaling type and that type's settings."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position: int | None = None
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn; None derives it from factor


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Architecture of one Llama-family decoder."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope: RopeConfig
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    sliding_window: int | None
    eos_token_ids: tuple[int, ...] = field(default=())
    torch_dtype: str = "float32"

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_dir(cls, path: Path) -> ModelConfig:
        """Read config.json (and generation_config.json for EOS ids) from a checkpoint directory."""
        config_path = path / "config.json"
        if not config_path.is_file():
            raise CheckpointError(f"{path}: no config.json")
        raw = _read_json(config_path)
        generation_path = path / "generation_config.json"
        generation = _read_json(generation_path) if generation_path.is_file() else {}
        return cls.from_dict(raw, generation)

    @classmethod
    def from_dict(
        cls, raw: Mapping[str, Any], generation: Mapping[str, Any] | None = None
    ) -> ModelConfig:
        """Parse an HF config dict; raises CheckpointError for unsupported models."""
        model_type = str(raw.get("model_type", ""))
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise CheckpointError(
                f"model_type {model_type!r} is not supported "
                f"(supported: {', '.join(SUPPORTED_MODEL_TYPES)})"
            )
        if raw.get("hidden_act", "silu") != "silu":
            raise CheckpointError(f"hidden_act {raw.get('hidden_act')!r} is not supported")
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        head_dim = raw.get("head_dim") or hidden // heads
        is_qwen2 = model_type == "qwen2"
        attention_bias = bool(raw.get("attention_bias", False))
        return cls(
            model_type=model_type,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(head_dim),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=_rope_config(raw),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=is_qwen2 or attention_bias,
            o_bias=attention_bias and not is_qwen2,
            mlp_bias=bool(raw.get("mlp_bias", False)),
            sliding_window=_sliding_window(raw, is_qwen2),
            eos_token_ids=_eos_ids(raw, generation or {}),
            torch_dtype=str(raw.get("dtype") or raw.get("torch_dtype") or "float32"),
        )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path.name}: cannot read ({exc})") from exc
    if not isinstance(data, dict):
        raise CheckpointError(f"{path.name}: not a JSON object")
    return data


def _rope_config(raw: Mapping[str, Any]) -> RopeConfig:
    # transformers 5 writes `rope_parameters` (with rope_theta inside); older configs write
    # `rope_theta` and an optional `rope_scaling` dict.
    params: Mapping[str, Any] = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = str(params.get("rope_type", params.get("type", "default")))
    if rope_type not in ROPE_TYPES:
        raise CheckpointError(
            f"rope type {rope_type!r} is not supported (supported: {', '.join(ROPE_TYPES)})"
        )
    original = params.get("original_max_position_embeddings")
    attention_factor = params.get("attention_factor")
    return RopeConfig(
        theta=theta,
        rope_type=rope_type,
        factor=float(params.get("factor", 1.0)),
        original_max_position=int(original) if original is not None else None,
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        attention_factor=float(attention_factor) if attention_factor is not None else None,
    )


def _sliding_window(raw: Mapping[str, Any], is_qwen2: bool) -> int | None:
    window = raw.get("sliding_window")
    if window is None or (is_qwen2 and not raw.get("use_sliding_window", False)):
        return None
    return int(window)


def _eos_ids(raw: Mapping[str, Any], generation: Mapping[str, Any]) -> tuple[int, ...]:
    value = generation.get("eos_token_id", raw.get("eos_token_id"))
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(int(v) for v in value)
    return (int(value),)
