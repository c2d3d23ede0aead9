"""llama.cpp through llama-cpp-python's low-level bindings (the C API of llama.h): greedy
generation for one or many sequences at once.

Many sequences run the way llama.cpp's own `batched` example and llama-server's parallel slots do:
one context with n_seq_max sequences (a KV stream per sequence), every prompt prefilled in one
llama_decode call, then one llama_decode per step with the next token of every unfinished
sequence, each sampled by llama.cpp's greedy sampler. The high-level `Llama` class runs a single
sequence only, so it is not used.
"""

from __future__ import annotations

import importlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GGML_TYPE_F32 = 0  # ggml.h: KV cache kept in float32, like the engine's float32 cache
# llama.h's llama_flash_attn_type. llama.cpp's default (AUTO) enables flash attention on CPU,
# which computes attention partly in f16 (its greedy outputs then differ from transformers'
# float32 after near-ties); DISABLED keeps the whole forward pass in float32 (identical).
FLASH_ATTN_AUTO = -1
FLASH_ATTN_DISABLED = 0


@dataclass(frozen=True, slots=True)
class LlamaCppConfig:
    gguf: Path
    threads: int
    n_seq: int  # sequences decoded together at most
    n_ctx_per_seq: int  # prompt + output tokens one sequence may hold
    flash_attn: int = FLASH_ATTN_DISABLED


@dataclass(frozen=True, slots=True)
class Generation:
    outputs: list[list[int]]
    seconds: float  # submit to last token
    decode_seconds: float  # first sampled token to last token


class LlamaCppRunner:
    """One llama.cpp model + context; generate() clears the KV cache and runs greedy decoding."""

    def __init__(self, config: LlamaCppConfig) -> None:
        # Imported by name: llama-cpp-python is an optional extra (`make llama-cpp`).
        llama_cpp: Any = importlib.import_module("llama_cpp")
        # llama.cpp's load/context logs go through this logger; errors only.
        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
        self._ll = llama_cpp
        self._config = config
        llama_cpp.llama_backend_init()
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = 0
        self._model = llama_cpp.llama_model_load_from_file(str(config.gguf).encode(), model_params)
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load {config.gguf}")
        self._ctx = llama_cpp.llama_init_from_model(self._model, self._context_params())
        if not self._ctx:
            llama_cpp.llama_model_free(self._model)
            raise RuntimeError("llama.cpp could not create a context")
        self._sampler = llama_cpp.llama_sampler_chain_init(
            llama_cpp.llama_sampler_chain_default_params()
        )
        llama_cpp.llama_sampler_chain_add(self._sampler, llama_cpp.llama_sampler_init_greedy())
        self._capacity = config.n_seq * config.n_ctx_per_seq
        self._batch = llama_cpp.llama_batch_init(self._capacity, 0, 1)

    def _context_params(self) -> Any:
        cfg, params = self._config, self._ll.llama_context_default_params()
        params.n_ctx = cfg.n_seq * cfg.n_ctx_per_seq
        params.n_batch = cfg.n_seq * cfg.n_ctx_per_seq  # every prompt in one llama_decode call
        params.n_seq_max = cfg.n_seq
        params.n_threads = cfg.threads
        params.n_threads_batch = cfg.threads
        params.type_k = GGML_TYPE_F32
        params.type_v = GGML_TYPE_F32
        params.flash_attn_type = cfg.flash_attn
        params.no_perf = True
        return params

    def close(self) -> None:
        ll = self._ll
        ll.llama_batch_free(self._batch)
        ll.llama_sampler_free(self._sampler)
        ll.llama_free(self._ctx)
        ll.llama_model_free(self._model)

    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> Generation:
        if len(prompts) > self._config.n_seq:
            raise ValueError(f"{len(prompts)} prompts, the context holds {self._config.n_seq}")
        self._ll.llama_memory_clear(self._ll.llama_get_memory(self._ctx), True)
        start = time.perf_counter()
        rows = self._fill([(seq, 0, list(p)) for seq, p in enumerate(prompts)])
        self._decode()
        outputs = [[self._sample(row)] for row in rows]
        first = time.perf_counter()
        positions = [len(p) for p in prompts]
        for _ in range(max_tokens - 1):
            rows = self._fill([(seq, positions[seq], [out[-1]]) for seq, out in enumerate(outputs)])
            self._decode()
            for seq, row in enumerate(rows):
                outputs[seq].append(self._sample(row))
                positions[seq] += 1
        end = time.perf_counter()
        return Generation(outputs, end - start, end - first)

    def _fill(self, pieces: Sequence[tuple[int, int, list[int]]]) -> list[int]:
        """Put (sequence, first position, tokens) pieces into the batch, logits on each
        piece's last token; returns those tokens' rows in the batch."""
        total = sum(len(tokens) for _, _, tokens in pieces)
        if total > self._capacity:
            raise ValueError(f"{total} tokens exceed the batch capacity {self._capacity}")
        batch, rows, n = self._batch, [], 0
        for seq, pos, tokens in pieces:
            for i, token in enumerate(tokens):
                batch.token[n] = token
                batch.pos[n] = pos + i
                batch.n_seq_id[n] = 1
                batch.seq_id[n][0] = seq
                batch.logits[n] = i == len(tokens) - 1
                n += 1
            rows.append(n - 1)
        batch.n_tokens = n
        return rows

    def _decode(self) -> None:
        status = self._ll.llama_decode(self._ctx, self._batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status}")

    def _sample(self, row: int) -> int:
        return int(self._ll.llama_sampler_sample(self._sampler, self._ctx, row))
