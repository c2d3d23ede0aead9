"""Stand-in for the `tensorrt_llm` package (v1.x LLM API), for adapter tests on machines
without an NVIDIA GPU. Load it as a package (its modules import each other).

It mirrors the documented surface the adapter uses: `LLM(model, ..., **kwargs)` with kwargs
checked against the argument model, `generate_async(inputs, sampling_params, streaming=True)`
returning a result that `async for` yields *the same object, updated* with `token_ids_diff` /
`text_diff` / `logprobs_diff` deltas and `cached_tokens` (prompt tokens covered by full blocks
an earlier prompt stored, when `KvCacheConfig.enable_block_reuse`), `priority` validated to
[0, 1], `abort()` / `aborted()`, `get_stats(timeout)` returning
JSON strings of iteration stats, `get_kv_cache_capacity()`, `shutdown()`; `SamplingParams` and
`GuidedDecodingParams` with the real signatures (sampling_params.py); `llmapi.KvCacheConfig`.

The "model" is a toy whose logits are TOY_PEAK for (7 * last + 3 * position) mod vocab and 0
elsewhere, plus `embedding_bias`: greedy takes the first maximum, temperature > 0 a seeded
uniform pick (ignoring the logits). With `logprobs=k` each token gets the real PyTorch-backend
shape: {token_id: Logprob(logprob, rank)} for the top k (log-softmax of the toy logits), plus
the sampled token when it is not among them. Text is decoded with the checkpoint's
tokenizer.json. Guided decoding is recorded on the SamplingParams, not enforced.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import random
import time
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from .executor import CompletionOutput, Logprob
from .sampling_params import GuidedDecodingParams, SamplingParams

__all__ = ["LLM", "CompletionOutput", "GuidedDecodingParams", "Logprob", "SamplingParams"]

TOKENS_PER_BLOCK = 32
MAX_NUM_BLOCKS = 64
STEP_DELAY_S = 0.002
TOY_PEAK = 5.0
DEFAULT_REQUEST_PRIORITY = 0.5

# A subset of TorchLlmArgs.model_fields: unknown kwargs are rejected like the real LLM does.
_LLM_KWARGS = frozenset(
    {
        "pipeline_parallel_size", "context_parallel_size", "kv_cache_config", "max_batch_size",
        "max_num_tokens", "max_seq_len", "enable_chunked_prefill", "enable_iter_perf_stats",
        "enable_iter_req_stats", "return_perf_metrics", "backend", "guided_decoding_backend",
    }
)  # fmt: skip
_GUIDED_DECODING_BACKENDS = (None, "xgrammar", "llguidance")  # BaseLlmArgs' Literal


class RequestOutput:
    """GenerationResult: awaitable, async-iterable (same object, updated), abortable."""

    def __init__(
        self, llm: LLM, request_id: int, prompt: list[int], params: SamplingParams
    ) -> None:
        self.request_id = request_id
        self.prompt = None
        self.prompt_token_ids = prompt
        self.outputs = [CompletionOutput(index=0)]
        self.context_logits = None
        self.finished = False
        self.cached_tokens = 0  # set with the first response, as the context phase reports it
        self._llm = llm
        self._params = params
        self._aborted = False
        self._rng = random.Random(params.seed or 0)
        self._streaming = True

    def abort(self) -> None:
        self._aborted = True

    def aborted(self) -> bool:
        return self._aborted

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        self.outputs[0]._mark_read()
        await asyncio.sleep(STEP_DELAY_S)
        if self._aborted:
            self._finish("cancelled")
        else:
            self._step()
        self._llm._record_iteration()
        return self

    async def aresult(self) -> RequestOutput:
        async for _ in self:
            pass
        return self

    def _step(self) -> None:
        out, params = self.outputs[0], self._params
        if not out.token_ids:
            self.cached_tokens = self._llm._reuse(self.prompt_token_ids)
        logits = self._logits(self.prompt_token_ids + out.token_ids)
        token = self._next_token(logits)
        if token == params.end_id and not params.ignore_eos:
            self._finish("stop")
            return
        if params.stop_token_ids and token in params.stop_token_ids:
            self._finish("stop", token)
            return
        out.token_ids.append(token)
        if params.logprobs:
            out.logprobs.append(_logprob_entry(logits, token, params.logprobs))
        if params.detokenize:
            out.text = self._llm._decode(out.token_ids)
            if self._stop_string(out):
                return
        if len(out.token_ids) >= params.max_tokens:
            self._finish("length")

    def _logits(self, history: list[int]) -> list[float]:
        vocab = self._llm._vocab_size
        logits = [0.0] * vocab
        logits[(7 * history[-1] + 3 * len(history)) % vocab] = TOY_PEAK
        bias = self._params.embedding_bias
        if bias is not None:
            logits = [x + b for x, b in zip(logits, bias.tolist(), strict=True)]
        return logits

    def _next_token(self, logits: list[float]) -> int:
        if self._params.temperature:
            return self._rng.randrange(len(logits))
        return max(range(len(logits)), key=logits.__getitem__)

    def _stop_string(self, out: CompletionOutput) -> bool:
        stops = self._params.stop
        for stop in [stops] if isinstance(stops, str) else stops or []:
            index = out.text.find(stop)
            if index >= 0:
                out.text = out.text[:index]
                self._finish("stop", stop)
                return True
        return False

    def _finish(self, reason: str, stop_reason: int | str | None = None) -> None:
        self.finished = True
        self.outputs[0].finish_reason = reason
        self.outputs[0].stop_reason = stop_reason
        self._llm._active.pop(self.request_id, None)


class LLM:
    """The `tensorrt_llm.LLM` constructor signature and the methods the adapter calls."""

    def __init__(
        self,
        model: str | Path,
        tokenizer: Any = None,
        tokenizer_mode: str = "auto",
        skip_tokenizer_init: bool = False,
        trust_remote_code: bool = False,
        tensor_parallel_size: int = 1,
        dtype: str = "auto",
        revision: str | None = None,
        tokenizer_revision: str | None = None,
        **kwargs: Any,
    ) -> None:
        unknown = set(kwargs) - _LLM_KWARGS
        if unknown:
            raise ValueError(f"got invalid argument: {sorted(unknown)}")
        if kwargs.get("guided_decoding_backend") not in _GUIDED_DECODING_BACKENDS:
            raise ValueError(
                f"invalid guided_decoding_backend: {kwargs['guided_decoding_backend']}"
            )
        directory = Path(model)
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        self.args: dict[str, Any] = {
            "model": str(model),
            "tensor_parallel_size": tensor_parallel_size,
            "dtype": dtype,
            "skip_tokenizer_init": skip_tokenizer_init,
            **kwargs,
        }
        self._vocab_size = int(config["vocab_size"])
        self._eos = config.get("eos_token_id")
        self.tokenizer = (
            None if skip_tokenizer_init else Tokenizer.from_file(str(directory / "tokenizer.json"))
        )
        self._active: dict[int, RequestOutput] = {}
        self._ids = iter(range(1, 1 << 62))
        self._stats: collections.deque[str] = collections.deque(maxlen=1000)
        self.is_shutdown = False
        kv_cache_config = kwargs.get("kv_cache_config")
        self._block_reuse = kv_cache_config is None or kv_cache_config.enable_block_reuse
        self._stored_blocks: set[tuple[int, ...]] = set()
        self.priorities: list[float] = []  # stand-in only: what each request was given

    def generate_async(
        self,
        inputs: Any,
        sampling_params: SamplingParams | None = None,
        lora_request: Any = None,
        prompt_adapter_request: Any = None,
        streaming: bool = False,
        kv_cache_retention_config: Any = None,
        disaggregated_params: Any = None,
        trace_headers: Any = None,
        _postproc_params: Any = None,
        scheduling_params: Any = None,
        conversation_params: Any = None,
        cache_salt: str | None = None,
        priority: float = DEFAULT_REQUEST_PRIORITY,
    ) -> RequestOutput:
        if self.is_shutdown:
            raise RuntimeError("LLM is shut down")
        if not 0.0 <= priority <= 1.0:  # as the real one validates it
            raise ValueError(f"priority must be a float in [0.0, 1.0], got {priority}")
        prompt = inputs["prompt_token_ids"] if isinstance(inputs, dict) else inputs
        if not isinstance(prompt, list) or not all(isinstance(t, int) for t in prompt):
            raise TypeError("The inputs must be type str or list of int")
        params = sampling_params or SamplingParams()
        if params.end_id is None:
            if self.tokenizer is None:
                raise ValueError("tokenizer is required to reset end_id if it is None")
            params.end_id = self._eos
        bias = params.embedding_bias  # the stand-in adds it to its logits, so sizes must match
        if bias is not None and bias.shape != (self._vocab_size,):
            raise ValueError(f"embedding_bias shape {tuple(bias.shape)} != ({self._vocab_size},)")
        max_seq_len = self.args.get("max_seq_len")
        if max_seq_len is not None and len(prompt) + params.max_tokens > max_seq_len:
            raise ValueError(f"prompt + max_tokens should not exceed max_seq_len ({max_seq_len})")
        result = RequestOutput(self, next(self._ids), list(prompt), params)
        self._active[result.request_id] = result
        self.priorities.append(priority)
        return result

    def _reuse(self, prompt: list[int]) -> int:
        """Block reuse: prompt tokens covered by full blocks an earlier prompt stored (never
        the last prompt token, which is always recomputed); then stores this prompt's."""
        if not self._block_reuse:
            return 0
        blocks = [
            tuple(prompt[: i + TOKENS_PER_BLOCK]) for i in range(0, len(prompt), TOKENS_PER_BLOCK)
        ]
        full = [b for b in blocks if len(b) % TOKENS_PER_BLOCK == 0]
        hits = next((i for i, b in enumerate(full) if b not in self._stored_blocks), len(full))
        self._stored_blocks.update(full)
        return min(hits * TOKENS_PER_BLOCK, len(prompt) - 1)

    def get_stats(self, timeout: float | None = 2) -> list[str]:
        if not self._stats:
            time.sleep(min(timeout or 0.0, 0.01))
        entries = list(self._stats)
        self._stats.clear()
        return entries

    def get_kv_cache_capacity(self) -> dict[str, int]:
        return {
            "maxNumBlocks": MAX_NUM_BLOCKS,
            "tokensPerBlock": TOKENS_PER_BLOCK,
            "maxNumTokens": MAX_NUM_BLOCKS * TOKENS_PER_BLOCK,
        }

    def shutdown(self) -> None:
        self.is_shutdown = True

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc: object) -> bool:
        self.shutdown()
        return False

    def _decode(self, ids: list[int]) -> str:
        assert self.tokenizer is not None
        text: str = self.tokenizer.decode(ids)
        return text

    def _record_iteration(self) -> None:
        used = sum(
            math.ceil((len(r.prompt_token_ids) + len(r.outputs[0].token_ids)) / TOKENS_PER_BLOCK)
            for r in self._active.values()
        )
        generating = sum(1 for r in self._active.values() if r.outputs[0].token_ids)
        stats = {
            "iter": len(self._stats),
            "timestamp": time.time(),
            "numQueuedRequests": 0,
            "cpuMemUsage": 0,
            "gpuMemUsage": 0,
            "kvCacheStats": {"usedNumBlocks": used, "freeNumBlocks": MAX_NUM_BLOCKS - used},
            "inflightBatchingStats": {
                "numCtxTokens": 0,
                "numContextRequests": len(self._active) - generating,
                "numGenRequests": generating,
            },
        }
        self._stats.append(json.dumps(stats))


def _logprob_entry(logits: list[float], token: int, k: int) -> dict[int, Logprob]:
    """The top k as {token_id: Logprob(logprob, rank)}, plus `token` (rank > k) if not in it."""
    peak = max(logits)
    norm = peak + math.log(sum(math.exp(x - peak) for x in logits))
    order = sorted(range(len(logits)), key=lambda t: (-logits[t], t))
    entry = {t: Logprob(logits[t] - norm, rank) for rank, t in enumerate(order[:k], start=1)}
    if token not in entry:
        entry[token] = Logprob(logits[token] - norm, max(k + 1, order.index(token) + 1))
    return entry
