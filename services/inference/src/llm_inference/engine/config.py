"""EngineConfig: the knobs of one engine instance (dtype, device, KV budget, batching limits)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llm_common.config import ConfigError

Dtype = Literal["float32", "bfloat16", "float16"]
Device = Literal["cpu", "cuda"]
Quantization = Literal["none", "int8"]
AttentionBackend = Literal["auto", "paged", "gather"]

DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
DEVICES: tuple[str, ...] = ("cpu", "cuda")
QUANTIZATIONS: tuple[str, ...] = ("none", "int8")
ATTENTION_BACKENDS: tuple[str, ...] = ("auto", "paged", "gather")
GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Engine settings; validated on construction (ConfigError names the offending field)."""

    dtype: Dtype = "float32"
    device: Device = "cpu"
    kv_block_size: int = 16
    kv_cache_memory_bytes: int = GIB  # memory budget for the paged KV cache -> number of blocks
    max_num_seqs: int = 64
    max_batched_tokens: int = 2048  # per-step token budget (prefill chunks + decodes)
    enable_prefix_caching: bool = True
    quantization: Quantization = "none"
    max_context: int | None = None  # None: the checkpoint's max_position_embeddings
    seed: int = 0  # default RNG for requests without their own seed
    num_threads: int | None = None  # torch intra-op threads on CPU; None leaves torch's default
    # Speculative decoding (prompt lookup): draft tokens per step, 0 = off; see speculative.py.
    speculative_tokens: int = 0
    speculative_ngram_max: int = 3
    # Shortest suffix looked up. 2 doubles acceptance on demo-chat's editing prompts (0.51 vs
    # 0.38 with adaptive lengths) but drafts less often: same speed there, so 1 stays.
    speculative_ngram_min: int = 1
    speculative_max_batch: int = 8  # draft only while at most this many sequences decode
    # Decode attention: paged = in place over the block tables (CPU float32 kernel), gather =
    # copy each row's blocks into a contiguous buffer first (CUDA, other dtypes); auto picks.
    attention_backend: AttentionBackend = "auto"
    # Decode-only steps at bucketed fixed shapes (decode_graphs.py): captured and replayed as
    # CUDA graphs on CUDA; on CPU the same path runs eagerly (slower: for tests only). Off
    # until measured on a GPU (bench/gpu/run.sh runs both).
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("device", self.device, DEVICES)
        _check_choice("quantization", self.quantization, QUANTIZATIONS)
        _check_choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _check_positive("kv_block_size", self.kv_block_size)
        _check_positive("kv_cache_memory_bytes", self.kv_cache_memory_bytes)
        _check_positive("max_num_seqs", self.max_num_seqs)
        _check_positive("max_batched_tokens", self.max_batched_tokens)
        if self.max_context is not None:
            _check_positive("max_context", self.max_context)
        if self.num_threads is not None:
            _check_positive("num_threads", self.num_threads)
        if self.speculative_tokens < 0:
            raise ConfigError("speculative_tokens: must be >= 0", variable="speculative_tokens")
        _check_positive("speculative_ngram_max", self.speculative_ngram_max)
        _check_positive("speculative_ngram_min", self.speculative_ngram_min)
        if self.speculative_ngram_min > self.speculative_ngram_max:
            raise ConfigError(
                "speculative_ngram_min: must be <= speculative_ngram_max",
                variable="speculative_ngram_min",
            )
        _check_positive("speculative_max_batch", self.speculative_max_batch)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(
            f"{name}: must be one of {', '.join(choices)}, got {value!r}", variable=name
        )


def _check_positive(name: str, value: int) -> None:
    if value <= 0:
        raise ConfigError(f"{name}: must be > 0, got {value}", variable=name)
