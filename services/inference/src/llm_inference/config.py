"""Inference service settings, read from the environment once in __main__ (tests pass dicts)."""

from __future__ import annotations

import math
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from llm_common.config import (
    MIB,
    ConfigError,
    ServerSettings,
    env_bool,
    env_float,
    env_int,
    env_str,
    positive_ints_from_env,
    require_positive,
)

SERVICE_NAME = "inference"
DEFAULT_GRPC_PORT = 50054
DEFAULT_METRICS_PORT = 9154
DEFAULT_MODELS_CONFIG = "infra/config/models.yaml"
DEFAULT_MODEL_ROOT = ".cache/models"
DEFAULT_MODEL = "default"  # an alias in models.yaml

BACKENDS = ("torch", "tensorrt_llm")
DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZATIONS = ("none", "int8")
DEVICES = ("auto", "cpu", "cuda")  # CUDA_VISIBLE_DEVICES picks the GPU


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """How the generation backend is built; `auto` values are resolved when it is built."""

    backend: str = "torch"
    device: str = "auto"  # auto: cuda when available, else cpu
    dtype: str = "auto"  # auto: bfloat16 on cuda, float32 on cpu
    kv_cache_bytes: int = 256 * MIB  # torch engine: memory budget for KV blocks
    gpu_memory_fraction: float = 0.9  # tensorrt_llm: share of free GPU memory for the KV cache
    max_num_seqs: int = 64
    max_batched_tokens: int = 2048
    kv_block_size: int = 16
    prefix_caching: bool = True
    quantization: str = "none"
    tensor_parallel_size: int = 1  # tensorrt_llm only
    pipeline_parallel_size: int = 1  # tensorrt_llm only
    seed: int = 0
    # tensorrt_llm: build the LLM with xgrammar guided decoding (output formats); off, a request
    # with sampling.format is INVALID_ARGUMENT. The torch engine always constrains.
    constrained_decoding: bool = True
    # torch engine: prompt-lookup draft tokens per step, 0 = off (greedy requests only;
    # sampling.disable_speculation opts a request out).
    speculative_tokens: int = 0
    # torch engine on CUDA: decode-only steps replayed as CUDA graphs (engine/decode_graphs.py;
    # 3-8x tokens/s on an H200, ADR 0022). Ignored on CPU, where fixed shapes only cost.
    cuda_graphs: bool = True

    def __post_init__(self) -> None:
        _one_of("INFERENCE_BACKEND", self.backend, BACKENDS)
        _one_of("INFERENCE_DTYPE", self.dtype, DTYPES)
        _one_of("INFERENCE_QUANTIZATION", self.quantization, QUANTIZATIONS)
        _one_of("INFERENCE_DEVICE", self.device, DEVICES)
        if not (math.isfinite(self.gpu_memory_fraction) and 0 < self.gpu_memory_fraction <= 1):
            raise ConfigError.for_variable("INFERENCE_GPU_MEMORY_FRACTION", "must be in (0, 1]")
        require_positive(self, _ENGINE_INTS)
        if self.quantization == "int8" and self.backend != "torch":
            raise ConfigError.for_variable(
                "INFERENCE_QUANTIZATION", "int8 is a torch-backend option"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        defaults = cls()
        ints = positive_ints_from_env(environ, _ENGINE_INTS, defaults)
        return cls(
            backend=env_str(environ, "INFERENCE_BACKEND", defaults.backend).lower(),
            device=env_str(environ, "INFERENCE_DEVICE", defaults.device).lower(),
            dtype=env_str(environ, "INFERENCE_DTYPE", defaults.dtype).lower(),
            gpu_memory_fraction=env_float(
                environ, "INFERENCE_GPU_MEMORY_FRACTION", defaults.gpu_memory_fraction
            ),
            prefix_caching=env_bool(environ, "INFERENCE_PREFIX_CACHING", defaults.prefix_caching),
            quantization=env_str(environ, "INFERENCE_QUANTIZATION", defaults.quantization).lower(),
            seed=env_int(environ, "INFERENCE_SEED", defaults.seed, min_value=0),
            constrained_decoding=env_bool(
                environ, "INFERENCE_CONSTRAINED_DECODING", defaults.constrained_decoding
            ),
            speculative_tokens=env_int(
                environ, "INFERENCE_SPECULATIVE_TOKENS", defaults.speculative_tokens, min_value=0
            ),
            cuda_graphs=env_bool(environ, "INFERENCE_CUDA_GRAPHS", defaults.cuda_graphs),
            **ints,
        )


_ENGINE_INTS = {
    "kv_cache_bytes": "INFERENCE_KV_CACHE_BYTES",
    "max_num_seqs": "INFERENCE_MAX_NUM_SEQS",
    "max_batched_tokens": "INFERENCE_MAX_BATCHED_TOKENS",
    "kv_block_size": "INFERENCE_KV_BLOCK_SIZE",
    "tensor_parallel_size": "INFERENCE_TENSOR_PARALLEL_SIZE",
    "pipeline_parallel_size": "INFERENCE_PIPELINE_PARALLEL_SIZE",
}


@dataclass(frozen=True, slots=True)
class Limits:
    """Request size limits, checked before any work reaches the engine."""

    max_stop_strings: int = 16
    max_stop_string_bytes: int = 256
    max_stop_token_ids: int = 64
    max_embed_inputs: int = 256
    max_embed_text_bytes: int = 64 * 1024
    embed_batch_size: int = 32  # texts per encoder forward pass

    def __post_init__(self) -> None:
        require_positive(self, _LIMIT_VARIABLES)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        return cls(**positive_ints_from_env(environ, _LIMIT_VARIABLES, cls()))


_LIMIT_VARIABLES = {
    "max_stop_strings": "INFERENCE_MAX_STOP_STRINGS",
    "max_stop_string_bytes": "INFERENCE_MAX_STOP_STRING_BYTES",
    "max_stop_token_ids": "INFERENCE_MAX_STOP_TOKEN_IDS",
    "max_embed_inputs": "INFERENCE_MAX_EMBED_INPUTS",
    "max_embed_text_bytes": "INFERENCE_MAX_EMBED_TEXT_BYTES",
    "embed_batch_size": "INFERENCE_EMBED_BATCH_SIZE",
}


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the inference service needs to run one model on this replica."""

    server: ServerSettings
    model: str = DEFAULT_MODEL
    models_config: Path = Path(DEFAULT_MODELS_CONFIG)
    model_root: Path = Path(DEFAULT_MODEL_ROOT)
    checkpoint: Path | None = None  # overrides the catalogue's checkpoint directory
    replica_id: str = ""
    engine: EngineSettings = field(default_factory=EngineSettings)
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError.for_variable("INFERENCE_MODEL", "must not be empty")
        if len(self.replica_id) > 256:
            raise ConfigError.for_variable("REPLICA_ID", "must be at most 256 characters")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        """Read GRPC_PORT, METRICS_PORT, ... (see ServerSettings), INFERENCE_MODEL,
        MODELS_CONFIG, MODEL_ROOT, INFERENCE_CHECKPOINT, REPLICA_ID, INFERENCE_* engine
        settings and limits; ConfigError names the offending variable."""
        server = ServerSettings.from_env(
            environ,
            service_name=SERVICE_NAME,
            default_grpc_port=DEFAULT_GRPC_PORT,
            default_metrics_port=DEFAULT_METRICS_PORT,
        )
        checkpoint = env_str(environ, "INFERENCE_CHECKPOINT")
        return cls(
            server=server,
            model=env_str(environ, "INFERENCE_MODEL", DEFAULT_MODEL),
            models_config=Path(env_str(environ, "MODELS_CONFIG", DEFAULT_MODELS_CONFIG)),
            model_root=Path(env_str(environ, "MODEL_ROOT", DEFAULT_MODEL_ROOT)),
            checkpoint=None if checkpoint is None else Path(checkpoint),
            replica_id=env_str(environ, "REPLICA_ID", f"{socket.gethostname()}:{server.grpc_port}"),
            engine=EngineSettings.from_env(environ),
            limits=Limits.from_env(environ),
        )


def _one_of(variable: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError.for_variable(variable, f"must be one of {', '.join(allowed)}")
