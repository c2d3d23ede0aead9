"""Where a decode step's time goes on the GPU: torch.profiler over decode-only engine steps of
the random 1.1B checkpoint, eager and with CUDA graphs; the top kernels by GPU time, kernels
per step, and GPU-busy vs wall time per step. Run after bench/gpu/run.sh built the checkpoint:

    python -m gpu.profile_step MODEL_DIR OUT.json [--batch 1 64] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from gpu.runs import engine_config, greedy, random_requests
from torch.profiler import DeviceType, ProfilerActivity, profile

from llm_inference.engine.config import Device
from llm_inference.engine.core import EngineCore
from llm_inference.engine.loader import load_model

STEPS = 20


def _sync(device: Device) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _core(model_dir: Path, device: Device, batch: int, cuda_graphs: bool) -> EngineCore:
    config = engine_config(device, 4 << 30, batch, cuda_graphs)
    model = load_model(model_dir, dtype=config.dtype, device=device, max_positions=2048)
    core = EngineCore(model, config, model_name=model_dir.name)
    for i, r in enumerate(random_requests(batch, 128, 64, model.config.vocab_size, seed=3)):
        core.add_request(f"p{i}", r.prompt, greedy(r.max_tokens))
    for _ in range(8):  # prefill and a few decode steps (graph capture happens here)
        core.step()
    _sync(device)
    return core


def profile_steps(model_dir: Path, device: Device, batch: int, cuda_graphs: bool) -> dict[str, Any]:
    core = _core(model_dir, device, batch, cuda_graphs)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(STEPS):
            core.step()
        _sync(device)
        wall_ms = (time.perf_counter() - start) * 1000 / STEPS
    averages = prof.key_averages()
    events = [e for e in averages if e.device_type == DeviceType.CUDA]
    host = sorted(averages, key=lambda e: e.self_cpu_time_total, reverse=True)[:10]
    gpu_us = sum(e.self_device_time_total for e in events) / STEPS
    kernels = sum(e.count for e in events) / STEPS
    top = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)[:12]
    del core
    if device == "cuda":
        torch.cuda.empty_cache()
    return {
        "batch": batch,
        "cuda_graphs": cuda_graphs,
        "wall_ms_per_step_profiled": wall_ms,
        "gpu_busy_ms_per_step": gpu_us / 1000,
        "kernels_per_step": kernels,
        "top_kernels": [_row(e, e.self_device_time_total, "ms_per_step") for e in top],
        "top_host_ops": [_row(e, e.self_cpu_time_total, "self_cpu_ms_per_step") for e in host],
    }


def _row(event: Any, total_us: float, field: str) -> dict[str, Any]:
    return {
        "name": event.key[:120],
        field: total_us / 1000 / STEPS,
        "calls_per_step": event.count / STEPS,
    }


def _print(result: dict[str, Any]) -> None:
    print(
        f"batch {result['batch']} graphs {result['cuda_graphs']}: "
        f"wall {result['wall_ms_per_step_profiled']:.2f} ms, "
        f"GPU busy {result['gpu_busy_ms_per_step']:.2f} ms, "
        f"{result['kernels_per_step']:.0f} kernels"
    )
    for k in result["top_kernels"][:6]:
        print(f"    {k['ms_per_step']:.3f} ms x{k['calls_per_step']:.0f}  {k['name']}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    args = parser.parse_args()
    results = [
        profile_steps(args.model_dir, args.device, batch, graphs)
        for batch in args.batch
        for graphs in (False, True)
    ]
    args.out.write_text(json.dumps(results, indent=2) + "\n", "utf-8")
    for result in results:
        _print(result)


if __name__ == "__main__":
    main()
