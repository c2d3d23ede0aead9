"""Stand-in for `tensorrt_llm.llmapi` (see the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass

from tensorrt_llm import LLM
from tensorrt_llm.sampling_params import GuidedDecodingParams, SamplingParams

__all__ = ["LLM", "GuidedDecodingParams", "KvCacheConfig", "SamplingParams"]


@dataclass(kw_only=True)
class KvCacheConfig:
    enable_block_reuse: bool = True
    max_tokens: int | None = None
    free_gpu_memory_fraction: float | None = 0.9
    host_cache_size: int | None = None
    max_attention_window: list[int] | None = None
    sink_token_length: int | None = None
    event_buffer_max_size: int = 0
