"""Checkpoint loading (dtypes, shards, errors), KV sizing from the memory budget, config checks."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F  # noqa: N812
from safetensors.torch import load_file, save_file

from llm_common.config import ConfigError
from llm_inference.engine.api import InvalidRequest, SamplingOptions
from llm_inference.engine.config import EngineConfig
from llm_inference.engine.core import EngineCore
from llm_inference.engine.kv_cache import bytes_per_block
from llm_inference.engine.loader import INDEX_FILE, load_model
from llm_inference.engine.models.config import CheckpointError
from llm_inference.engine.packed_linear import PackedLinear, PackedSwiGLU, load_packed_kernel


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_loads_in_each_dtype(checkpoints: Callable[[str], Path], dtype: str) -> None:
    model = load_model(checkpoints("qwen2-gqa-bias"), dtype=dtype, device="cpu", max_positions=64)
    assert str(model.dtype) == f"torch.{dtype}"
    assert all(p.dtype == model.dtype for p in model.parameters())


def test_sharded_checkpoint_is_read_through_its_index(checkpoints: Callable[[str], Path]) -> None:
    path = checkpoints("linear-rope-sharded")
    assert (path / INDEX_FILE).is_file()
    assert len(list(path.glob("*.safetensors"))) > 1
    model = load_model(path, dtype="float32", device="cpu", max_positions=64)
    assert len(model.layers) == 2


def test_tied_embeddings_share_the_embedding_matrix(checkpoints: Callable[[str], Path]) -> None:
    model = load_model(
        checkpoints("llama-mha-tied"), dtype="float32", device="cpu", max_positions=64
    )
    assert model.lm_head.weight.data_ptr() == model.embed_tokens.data_ptr()


def test_wide_layers_keep_the_transposed_weight_without_packing(
    checkpoints: Callable[[str], Path],
) -> None:
    path = checkpoints("llama-gqa-untied")
    tensors = load_file(str(path / "model.safetensors"))
    model = load_model(path, dtype="float32", device="cpu", max_positions=64, packed=False)
    layer = model.layers[0]
    gate_up, down = layer.mlp.gate_up_proj, layer.mlp.down_proj
    assert gate_up.transposed  # 192 outputs from 64 inputs
    assert not down.transposed  # 64 outputs from 96 inputs
    assert model.lm_head.transposed  # untied, vocab 384 > hidden 64
    assert gate_up.out_features == 192
    gate = tensors["model.layers.0.mlp.gate_proj.weight"]
    x = torch.randn(3, 64)
    torch.testing.assert_close(gate_up(x)[:, :96], x @ gate.T)
    half = load_model(path, dtype="bfloat16", device="cpu", max_positions=64)
    assert not half.layers[0].mlp.gate_up_proj.transposed


@pytest.mark.skipif(load_packed_kernel() is None, reason="no C++ toolchain for the kernel")
def test_cpu_float32_layers_are_packed_and_match_the_checkpoint(
    checkpoints: Callable[[str], Path],
) -> None:
    path = checkpoints("llama-gqa-untied")
    tensors = load_file(str(path / "model.safetensors"))
    model = load_model(path, dtype="float32", device="cpu", max_positions=64)
    layer = model.layers[0]
    for linear in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.down_proj):
        assert isinstance(linear, PackedLinear)
    assert isinstance(model.lm_head, PackedLinear)  # untied
    assert isinstance(layer.mlp.gate_up_proj, PackedSwiGLU)
    assert layer.mlp.activates
    x = torch.randn(5, 96)
    down = tensors["model.layers.0.mlp.down_proj.weight"]
    torch.testing.assert_close(layer.mlp.down_proj(x), x @ down.T)
    x = torch.randn(5, 64)
    gate = x @ tensors["model.layers.0.mlp.gate_proj.weight"].T
    up = x @ tensors["model.layers.0.mlp.up_proj.weight"].T
    torch.testing.assert_close(layer.mlp.gate_up_proj(x), F.silu(gate) * up)
    half = load_model(path, dtype="bfloat16", device="cpu", max_positions=64)
    assert not isinstance(half.layers[0].mlp.down_proj, PackedLinear)
    assert not half.layers[0].mlp.activates
    tied = load_model(
        checkpoints("llama-mha-tied"), dtype="float32", device="cpu", max_positions=64
    )
    assert not isinstance(tied.lm_head, PackedLinear)  # shares the embedding matrix


def test_missing_tensor_and_shard_are_clear_errors(
    checkpoints: Callable[[str], Path], tmp_path: Path
) -> None:
    source = checkpoints("llama-gqa-untied")
    broken = tmp_path / "broken"
    shutil.copytree(source, broken)
    tensors = load_file(str(broken / "model.safetensors"))
    del tensors["model.layers.1.mlp.down_proj.weight"]
    save_file(tensors, str(broken / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"model\.layers\.1\.mlp\.down_proj\.weight"):
        load_model(broken, dtype="float32", device="cpu", max_positions=64)
    sharded = tmp_path / "sharded"
    shutil.copytree(checkpoints("linear-rope-sharded"), sharded)
    next(iter(sorted(sharded.glob("*.safetensors")))).unlink()
    with pytest.raises(CheckpointError, match="missing shards"):
        load_model(sharded, dtype="float32", device="cpu", max_positions=64)
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copy(source / "config.json", empty / "config.json")
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors"):
        load_model(empty, dtype="float32", device="cpu", max_positions=64)


def test_kv_blocks_follow_the_memory_budget_and_cap_the_context(
    checkpoints: Callable[[str], Path],
) -> None:
    path = checkpoints("llama-gqa-untied")
    config = EngineConfig(kv_cache_memory_bytes=50 * 1024, kv_block_size=8)
    core = EngineCore.from_checkpoint(path, config, "tiny")
    per_block = bytes_per_block(core.model_config, 8, torch.float32)
    assert per_block == 2 * 2 * 8 * 2 * 16 * 4
    assert core.block_manager.num_blocks == 50 * 1024 // per_block
    info = core.info()
    assert info.kv_blocks_total == core.block_manager.num_blocks
    assert info.max_context == core.block_manager.num_blocks * 8  # less than the trained 256
    assert core.runner.kv_caches[0][0].shape == (core.block_manager.num_blocks, 2, 8, 16)
    assert core.tokenizer is None
    with pytest.raises(InvalidRequest, match="tokenizer"):
        core.add_request("s", [1, 2], SamplingOptions(stop_strings=("x",)))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"dtype": "float64"}, "dtype"),
        ({"device": "tpu"}, "device"),
        ({"quantization": "int4"}, "quantization"),
        ({"kv_block_size": 0}, "kv_block_size"),
        ({"max_num_seqs": -1}, "max_num_seqs"),
        ({"max_batched_tokens": 0}, "max_batched_tokens"),
    ],
)
def test_engine_config_rejects_bad_values(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError, match=field) as info:
        EngineConfig(**kwargs)
    assert info.value.variable == field


def test_budget_too_small_for_two_blocks_is_a_config_error(
    checkpoints: Callable[[str], Path],
) -> None:
    with pytest.raises(ConfigError, match="kv_cache_memory_bytes"):
        EngineCore.from_checkpoint(
            checkpoints("llama-gqa-untied"), EngineConfig(kv_cache_memory_bytes=100), "tiny"
        )
