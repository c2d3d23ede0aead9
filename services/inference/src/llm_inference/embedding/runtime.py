"""Serves a SentenceEncoder to asyncio callers, one batch at a time, and reports its load."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from llm_inference.embedding.encoder import EmbeddingResult, SentenceEncoder
from llm_inference.engine.api import EngineInfo, LoadSnapshot
from llm_inference.rate import RateMeter

_DTYPE_NAMES = {
    "torch.float32": "float32",
    "torch.bfloat16": "bfloat16",
    "torch.float16": "float16",
}


class EmbeddingRuntime:
    """Runs encoder calls in a worker thread, one at a time.

    One at a time: torch already spreads a batch over every core, so parallel calls would
    only contend; queued callers are reported as waiting.
    """

    def __init__(self, encoder: SentenceEncoder, model: str) -> None:
        self._encoder = encoder
        self._model = model
        self._lock = asyncio.Lock()
        self._waiting = 0
        self._running = 0
        self._tokens = RateMeter()

    async def embed(self, texts: Sequence[str], *, normalize: bool) -> EmbeddingResult:
        self._waiting += 1
        try:
            await self._lock.acquire()
        finally:
            self._waiting -= 1
        self._running += 1
        try:
            result = await asyncio.to_thread(self._encoder.encode, texts, normalize=normalize)
        finally:
            self._running -= 1
            self._lock.release()
        self._tokens.add(result.prompt_tokens)
        return result

    def load(self) -> LoadSnapshot:
        return LoadSnapshot(
            num_waiting=self._waiting,
            num_running=self._running,
            kv_blocks_total=0,
            kv_blocks_free=0,
            kv_cache_usage=0.0,
            waiting_prompt_tokens=0,
            running_remaining_tokens=0,
            tokens_per_second=self._tokens.rate(),
            prefix_cache_hit_rate=0.0,
            max_num_seqs=self._encoder.batch_size,
        )

    def info(self) -> EngineInfo:
        device = self._encoder.device
        return EngineInfo(
            model=self._model,
            backend="torch",
            dtype=_DTYPE_NAMES.get(str(self._encoder.dtype), str(self._encoder.dtype)),
            device=str(device),
            max_context=self._encoder.max_length,
            kv_block_size=0,
            kv_blocks_total=0,
            max_num_seqs=self._encoder.batch_size,
            max_batched_tokens=self._encoder.batch_size * self._encoder.max_length,
        )
