"""bench_engine's baselines: transformers generate in static batches, int8 vs float32."""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from engine_config import FIRST_ID, MODEL
from engine_runs import engine_config
from engine_values import Request, RunResult

from llm_inference.engine.accuracy import compare_engines
from llm_inference.engine.config import EngineConfig
from llm_inference.engine.core import EngineCore


def bench_transformers(model_dir: Path, requests: Sequence[Request], batch_size: int) -> RunResult:
    """transformers generate over static left-padded batches of the requests, in order."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, local_files_only=True
    )
    model.train(False)
    pad = 2
    start, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for i in range(0, len(requests), batch_size):
            batch = requests[i : i + batch_size]
            width = max(len(r.prompt) for r in batch)
            ids = torch.full((len(batch), width), pad)
            mask = torch.zeros(len(batch), width, dtype=torch.long)
            for row, request in enumerate(batch):
                ids[row, width - len(request.prompt) :] = torch.tensor(request.prompt)
                mask[row, width - len(request.prompt) :] = 1
            steps = max(r.max_tokens for r in batch)
            # min_new_tokens keeps EOS from ending rows early, like ignore_eos in the engine.
            model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=steps,
                min_new_tokens=steps,
                do_sample=False,
                pad_token_id=pad,
            )
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return RunResult(sum(r.max_tokens for r in requests), seconds, cpu, [])


def bench_int8(model_dir: Path, vocab: int) -> dict[str, Any]:
    full = EngineCore.from_checkpoint(model_dir, engine_config(), MODEL)
    int8 = EngineCore.from_checkpoint(
        model_dir, EngineConfig(kv_cache_memory_bytes=64 << 20, quantization="int8"), MODEL
    )
    rng = random.Random(11)
    prompts = [[rng.randrange(FIRST_ID, vocab) for _ in range(64)] for _ in range(8)]
    report = compare_engines(full, int8, prompts, steps=32)
    return {
        **asdict(report),
        "weight_bytes_float32": weight_bytes(full.runner.model),
        "weight_bytes_int8": weight_bytes(int8.runner.model),
    }


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the checkpoint's tensors as held (tied tensors counted once)."""
    seen: dict[int, int] = {}
    for tensor in model.state_dict().values():
        seen[tensor.data_ptr()] = tensor.numel() * tensor.element_size()
    return sum(seen.values())
