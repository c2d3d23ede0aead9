"""Backend selection: INFERENCE_BACKEND=torch -> the PyTorch engine, tensorrt_llm -> the adapter."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from llm_common.config import ConfigError
from llm_inference.config import EngineSettings
from llm_inference.engine.api import GenerationBackend
from llm_inference.engine.config import Device, Dtype, EngineConfig, Quantization


def resolve_device(setting: str) -> str:
    """`auto` -> cuda when a CUDA device is visible, else cpu; ConfigError for absent CUDA."""
    import torch  # deferred: config parsing must not pay for importing torch

    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if setting == "cuda" and not torch.cuda.is_available():
        raise ConfigError.for_variable("INFERENCE_DEVICE", "cuda requested but no CUDA device")
    return setting


def resolve_dtype(setting: str, device: str) -> str:
    """`auto` -> bfloat16 on CUDA, float32 on CPU (CPU half-precision matmuls are slow)."""
    if setting != "auto":
        return setting
    return "bfloat16" if device == "cuda" else "float32"


def engine_config(engine: EngineSettings, max_context: int | None) -> EngineConfig:
    """The PyTorch engine's config from the service settings."""
    device = resolve_device(engine.device)
    return EngineConfig(
        dtype=cast(Dtype, resolve_dtype(engine.dtype, device)),
        device=cast(Device, device),
        kv_block_size=engine.kv_block_size,
        kv_cache_memory_bytes=engine.kv_cache_bytes,
        max_num_seqs=engine.max_num_seqs,
        max_batched_tokens=engine.max_batched_tokens,
        enable_prefix_caching=engine.prefix_caching,
        quantization=cast(Quantization, engine.quantization),
        max_context=max_context,
        seed=engine.seed,
        speculative_tokens=engine.speculative_tokens,
        cuda_graphs=engine.cuda_graphs and device == "cuda",
    )


def build_backend(
    engine: EngineSettings, checkpoint: Path, model_name: str, max_context: int
) -> GenerationBackend:
    """Load the model with the configured backend (blocking: weights are read here)."""
    if engine.backend == "tensorrt_llm":
        from llm_inference.backends.trtllm import TrtLlmBackend, TrtLlmConfig

        config = TrtLlmConfig(
            checkpoint=checkpoint,
            model_name=model_name,
            max_context=max_context,
            dtype=engine.dtype,
            tensor_parallel_size=engine.tensor_parallel_size,
            pipeline_parallel_size=engine.pipeline_parallel_size,
            max_num_seqs=engine.max_num_seqs,
            max_batched_tokens=engine.max_batched_tokens,
            gpu_memory_fraction=engine.gpu_memory_fraction,
            enable_block_reuse=engine.prefix_caching,
            constrained_decoding=engine.constrained_decoding,
        )
        return TrtLlmBackend(config)
    from llm_inference.engine.engine import AsyncEngine

    return AsyncEngine.from_checkpoint(checkpoint, engine_config(engine, max_context), model_name)
