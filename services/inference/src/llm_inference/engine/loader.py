"""Build a LlamaModel from a Hugging Face checkpoint directory (config.json + *.safetensors)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from .fused_ops import FusedOps, load_fused_ops
from .models.config import CheckpointError, ModelConfig
from .models.llama import MLP, Attention, DecoderLayer, Linear, LlamaModel, RMSNorm
from .packed_linear import PackedKernel, PackedLinear, PackedSwiGLU, load_packed_kernel
from .quant import Int8Linear

INDEX_FILE = "model.safetensors.index.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model(
    path: Path,
    *,
    dtype: str,
    device: str,
    max_positions: int,
    quantization: str = "none",
    packed: bool = True,
) -> LlamaModel:
    """Read weights, fuse q/k/v and gate/up, optionally quantize; return the model in eval mode.

    packed: on CPU float32, linear layers use the packed kernel and norms and RoPE the fused
    ops when they build here (packed_linear.py, fused_ops.py); False keeps torch's own
    operations (for comparisons).
    """
    config = ModelConfig.from_dir(path)
    torch_dtype = DTYPES[dtype]
    weights = _Weights(dict(_read_tensors(path, torch_dtype, torch.device(device))))
    make = _LinearFactory(quantization, torch_dtype, torch.device(device), packed)
    ops = load_fused_ops() if make.packed else None
    layers = [_layer(config, weights, i, make, ops) for i in range(config.num_layers)]
    embed = weights.take("model.embed_tokens.weight")
    head_weight = weights.take_optional("lm_head.weight")
    if config.tie_word_embeddings or head_weight is None:
        lm_head: nn.Module = Linear(embed)
    else:
        lm_head = make(head_weight, None)
    norm = RMSNorm(weights.take("model.norm.weight"), config.rms_norm_eps, ops)
    model = LlamaModel(config, embed, layers, norm, lm_head, max_positions)
    return model.eval()


def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint, following a sharded index when present."""
    index = path / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        except (OSError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{INDEX_FILE}: cannot read ({exc})") from exc
        files = [path / name for name in sorted(set(weight_map.values()))]
    else:
        files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors files")
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise CheckpointError(f"{path}: missing shards {', '.join(missing)}")
    return files


def _read_tensors(
    path: Path, dtype: torch.dtype, device: torch.device
) -> Iterator[tuple[str, torch.Tensor]]:
    for file in checkpoint_files(path):
        with safe_open(str(file), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open handles are not iterable
                tensor: torch.Tensor = handle.get_tensor(name)
                yield name, tensor.to(device=device, dtype=dtype)


class _Weights:
    """Named tensors consumed once each, with a clear error for a missing one."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self._tensors = tensors

    def take(self, name: str) -> torch.Tensor:
        tensor = self._tensors.pop(name, None)
        if tensor is None:
            raise CheckpointError(f"checkpoint has no tensor {name!r}")
        return tensor

    def take_optional(self, name: str) -> torch.Tensor | None:
        return self._tensors.pop(name, None)


class _LinearFactory:
    """Builds full-precision or int8 linear layers, as configured."""

    def __init__(
        self, quantization: str, dtype: torch.dtype, device: torch.device, packed: bool
    ) -> None:
        self._int8 = quantization == "int8"
        self._dtype = dtype
        cpu_f32 = device.type == "cpu" and dtype == torch.float32
        self._kernel: PackedKernel | None = (
            load_packed_kernel() if cpu_f32 and packed and not self._int8 else None
        )
        # CPU float32 without the kernel: layers with more outputs than inputs keep W^T
        # (Linear's docstring).
        self._transpose_wide = cpu_f32

    @property
    def packed(self) -> bool:
        """Whether linear layers use the packed CPU kernel (CPU float32, not int8, built)."""
        return self._kernel is not None

    def __call__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> nn.Module:
        if self._int8:
            return Int8Linear(weight, bias, self._dtype)
        if self._kernel is not None:
            return PackedLinear(weight, bias, self._kernel)
        wide = weight.shape[0] > weight.shape[1]
        return Linear(weight, bias, transposed=self._transpose_wide and wide)

    def gate_up(
        self, gate: torch.Tensor, up: torch.Tensor, bias: torch.Tensor | None
    ) -> tuple[nn.Module, bool]:
        """The MLP's first half: (module, whether it applies SwiGLU itself). With the packed
        kernel and no biases one call gives silu(gate) * up; otherwise one fused matmul."""
        if self._kernel is not None and bias is None:
            return PackedSwiGLU(gate, up, self._kernel), True
        return self(torch.cat([gate, up], dim=0), bias), False


def _concat(weights: _Weights, names: list[str]) -> torch.Tensor:
    """Required tensors concatenated along the output dimension (a fused projection)."""
    return torch.cat([weights.take(name) for name in names], dim=0)


def _concat_optional(weights: _Weights, names: list[str]) -> torch.Tensor | None:
    """Like _concat for optional tensors (biases): all present, or none."""
    parts = [weights.take_optional(name) for name in names]
    present = [p for p in parts if p is not None]
    if not present:
        return None
    if len(present) != len(parts):
        raise CheckpointError(f"checkpoint has only some of {', '.join(names)}")
    return torch.cat(present, dim=0)


def _layer(
    config: ModelConfig, weights: _Weights, index: int, make: _LinearFactory, ops: FusedOps | None
) -> DecoderLayer:
    prefix = f"model.layers.{index}."
    attn = prefix + "self_attn."
    qkv = [f"{attn}{p}_proj" for p in ("q", "k", "v")]
    qkv_bias = _concat_optional(weights, [n + ".bias" for n in qkv])
    if config.qkv_bias and qkv_bias is None:
        raise CheckpointError(f"checkpoint has no q/k/v biases in layer {index}")
    o_bias = weights.take(attn + "o_proj.bias") if config.o_bias else None
    attention = Attention(
        config,
        make(_concat(weights, [n + ".weight" for n in qkv]), qkv_bias),
        make(weights.take(attn + "o_proj.weight"), o_bias),
        ops,
    )
    mlp = prefix + "mlp."
    gate_up = [f"{mlp}{p}_proj" for p in ("gate", "up")]
    gate_up_bias = _concat_optional(weights, [n + ".bias" for n in gate_up])
    down_bias = weights.take(mlp + "down_proj.bias") if config.mlp_bias else None
    gate_up_proj, activates = make.gate_up(
        weights.take(gate_up[0] + ".weight"), weights.take(gate_up[1] + ".weight"), gate_up_bias
    )
    feed_forward = MLP(
        gate_up_proj,
        make(weights.take(mlp + "down_proj.weight"), down_bias),
        config.intermediate_size,
        ops,
        activates=activates,
    )
    eps = config.rms_norm_eps
    return DecoderLayer(
        attention,
        feed_forward,
        RMSNorm(weights.take(prefix + "input_layernorm.weight"), eps, ops),
        RMSNorm(weights.take(prefix + "post_attention_layernorm.weight"), eps, ops),
    )
