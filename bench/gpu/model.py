"""The GPU benchmark's checkpoint: a seeded random Llama in Hugging Face layout.

The full run uses a ~1.1B-parameter shape (TinyLlama's: 22 layers, hidden 2048, GQA 32:4,
vocab 32000); --dry-run uses a tiny shape of the same architecture so the same code builds,
loads and measures it on CPU in seconds. No tokenizer is written: both engines are fed token ids.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

# Random weights with a wider init than the usual 0.02, so greedy argmaxes are not near-ties
# everywhere (bf16 comparisons would otherwise mostly measure rounding).
INIT_RANGE = 0.05


@dataclass(frozen=True, slots=True)
class ModelShape:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int = 2048

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def parameter_count(self) -> int:
        h, kv = self.hidden_size, self.num_key_value_heads * self.head_dim
        attention = 2 * h * h + 2 * h * kv
        mlp = 3 * h * self.intermediate_size
        per_layer = attention + mlp + 2 * h  # + the two RMSNorm weights
        return self.num_hidden_layers * per_layer + 2 * self.vocab_size * h + h

    def weight_bytes_per_step(self, dtype_bytes: int) -> int:
        """Weights a decode step reads: every matrix once, the embedding table only by row
        (negligible), the untied LM head in full."""
        return (self.parameter_count() - self.vocab_size * self.hidden_size) * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one cached token across all layers."""
        per_layer = 2 * self.num_key_value_heads * self.head_dim * dtype_bytes
        return self.num_hidden_layers * per_layer


LLAMA_1B = ModelShape("random-llama-1.1b", 32000, 2048, 5632, 22, 32, 4)
TINY = ModelShape("random-llama-tiny", 4096, 256, 688, 4, 8, 4)


def hf_config(shape: ModelShape) -> dict[str, Any]:
    fields = asdict(shape)
    fields.pop("name")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **fields,
        "head_dim": shape.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "initializer_range": INIT_RANGE,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "torch_dtype": "bfloat16",
    }


def build_checkpoint(shape: ModelShape, out_dir: Path, device: str, seed: int = 0) -> Path:
    """Write config.json + model.safetensors (bf16) for `shape` into out_dir (reused when the
    config there is identical: the weights depend only on shape and seed)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = {**hf_config(shape), "bench_seed": seed}
    config_file = out_dir / "config.json"
    weights = out_dir / "model.safetensors"
    if weights.is_file() and config_file.is_file() and _read(config_file) == config:
        return out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    with torch.device(device):  # initialise on the GPU: seconds instead of a minute on CPU
        model: Any = LlamaForCausalLM(LlamaConfig(**hf_config(shape)))
    model.to(torch.bfloat16).save_pretrained(out_dir, safe_serialization=True)
    del model
    config_file.write_text(json.dumps(config, indent=2) + "\n", "utf-8")
    return out_dir


def _read(path: Path) -> object:
    return json.loads(path.read_text("utf-8"))
