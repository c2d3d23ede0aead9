"""RoPE tables match transformers for every supported scaling type; config.json parsing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from llm_inference.engine.models.config import CheckpointError, ModelConfig
from llm_inference.engine.models.rope import apply_rope, rope_tables

BASE: dict[str, Any] = {
    "vocab_size": 64,
    "hidden_size": 64,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
}
ROPES: dict[str, dict[str, Any]] = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "yarn": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 16,
    },
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0},
}


def _hf_tables(config: Any, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    rotary = LlamaRotaryEmbedding(config)
    x = torch.zeros(1, positions, 16)
    cos, sin = rotary(x, torch.arange(positions)[None, :])
    return cos[0], sin[0]


@pytest.mark.parametrize("name", list(ROPES))
def test_tables_match_transformers_within_trained_length(name: str) -> None:
    hf_config = transformers.LlamaConfig(**BASE, rope_parameters=ROPES[name])
    ours = ModelConfig.from_dict(hf_config.to_dict())
    assert ours.rope.rope_type == name
    cos, sin = rope_tables(ours.rope, ours.head_dim, 64, ours.max_position_embeddings)
    hf_cos, hf_sin = _hf_tables(hf_config, 64)
    torch.testing.assert_close(cos, hf_cos, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(sin, hf_sin, atol=1e-6, rtol=1e-5)


def test_dynamic_scaling_beyond_trained_length_matches_at_each_sequence_end() -> None:
    hf_config = transformers.LlamaConfig(**BASE, rope_parameters=ROPES["dynamic"])
    ours = ModelConfig.from_dict(hf_config.to_dict())
    cos, _ = rope_tables(ours.rope, ours.head_dim, 160, ours.max_position_embeddings)
    for length in (65, 100, 160):
        # HF rescales from the forward's length; the position ending it matches exactly.
        hf_cos, _ = _hf_tables(hf_config, length)
        torch.testing.assert_close(cos[length - 1], hf_cos[-1], atol=1e-6, rtol=1e-5)
    default = ModelConfig.from_dict(transformers.LlamaConfig(**BASE).to_dict())
    plain, _ = rope_tables(default.rope, default.head_dim, 160, 64)
    assert torch.equal(cos[:64], plain[:64])
    assert not torch.allclose(cos[100], plain[100])


def test_apply_rope_rotates_pairs_of_halves() -> None:
    x = torch.randn(3, 2, 8)
    cos = torch.ones(3, 8)
    sin = torch.zeros(3, 8)
    torch.testing.assert_close(apply_rope(x, cos, sin), x)
    quarter = torch.full((3, 8), torch.pi / 2)
    rotated = apply_rope(x, quarter.cos(), quarter.sin())
    torch.testing.assert_close(rotated[..., :4], -x[..., 4:], atol=1e-6, rtol=0)


def test_config_reads_legacy_rope_scaling_and_qwen2_biases(tmp_path: Path) -> None:
    raw = {
        "model_type": "qwen2",
        "vocab_size": 10,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "rope_theta": 1e6,
        "rope_scaling": {"type": "linear", "factor": 2.0},
        "sliding_window": 32,
        "use_sliding_window": False,
        "eos_token_id": 3,
    }
    (tmp_path / "config.json").write_text(json.dumps(raw))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [3, 7]}))
    config = ModelConfig.from_dir(tmp_path)
    assert config.rope.theta == 1e6
    assert config.rope.rope_type == "linear"
    assert config.qkv_bias
    assert not config.o_bias
    assert config.num_kv_heads == 2
    assert config.head_dim == 4
    assert config.sliding_window is None  # Qwen2 ignores it unless use_sliding_window
    assert config.eos_token_ids == (3, 7)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"model_type": "gpt2"}, "not supported"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_scaling": {"type": "longrope"}}, "rope type"),
    ],
)
def test_unsupported_configs_are_rejected(patch: dict[str, Any], message: str) -> None:
    raw = {**transformers.LlamaConfig(**BASE).to_dict(), **patch}
    raw.pop("rope_parameters", None)
    with pytest.raises(CheckpointError, match=message):
        ModelConfig.from_dict(raw)


def test_missing_config_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no config\.json"):
        ModelConfig.from_dir(tmp_path)
