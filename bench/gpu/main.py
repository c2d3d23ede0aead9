"""GPU benchmark: bf16 correctness against transformers, throughput at batch 1/16/64, and decode
step time against the memory-bandwidth roofline, for a random ~1.1B Llama. Run via
bench/gpu/run.sh (which bounds it to 8 minutes); --dry-run runs the same code on CPU with a tiny
model of the same architecture.

Writes bench/results/gpu.json (--dry-run: gpu-dry-run.json). Exit status: 0 when the
correctness check passed, 1 when it failed, 2 when there is no CUDA device and no --dry-run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from gpu.check import Case, check_against_transformers
from gpu.model import LLAMA_1B, TINY, ModelShape, build_checkpoint
from gpu.roofline import Bandwidth, copy_bandwidth, step_roofline
from gpu.runs import BatchRun, engine_config, random_requests, run_batch, start_engine

from llm_inference.engine.config import Device

ROOT = Path(__file__).resolve().parents[2]
NO_CUDA = (
    "no CUDA device is visible (torch.cuda.is_available() is False): run this on a machine "
    "with an NVIDIA GPU and a CUDA build of torch, or pass --dry-run to run the same code "
    "paths on CPU with a tiny model"
)


@dataclass(frozen=True, slots=True)
class Plan:
    shape: ModelShape
    device: Device
    prompt_len: int
    max_tokens: int
    batches: tuple[int, ...]
    check_cases: int
    check_tokens: int
    kv_cache_bytes: int
    copy_buffer_bytes: int
    result_name: str


FULL = Plan(LLAMA_1B, "cuda", 128, 128, (1, 16, 64), 16, 64, 4 << 30, 1 << 30, "gpu.json")
DRY = Plan(TINY, "cpu", 32, 8, (1, 16, 64), 2, 8, 64 << 20, 32 << 20, "gpu-dry-run.json")


async def measure_engine(
    plan: Plan, model_dir: Path, cuda_graphs: bool
) -> tuple[dict[int, BatchRun], list[Case]]:
    """Throughput at each batch size (after a short warm-up at that size, which also captures
    that size's graphs), then the correctness cases, all on one engine."""
    config = engine_config(plan.device, plan.kv_cache_bytes, max(plan.batches), cuda_graphs)
    engine = await start_engine(model_dir, config)
    vocab = plan.shape.vocab_size
    try:
        runs: dict[int, BatchRun] = {}
        for batch in plan.batches:
            warm = random_requests(batch, plan.prompt_len, 4, vocab, seed=batch + 1000)
            await run_batch(engine, warm, f"warm{batch}")
            requests = random_requests(batch, plan.prompt_len, plan.max_tokens, vocab, seed=batch)
            runs[batch] = await run_batch(engine, requests, f"b{batch}")
        checks = random_requests(plan.check_cases, plan.prompt_len, plan.check_tokens, vocab, 7)
        done = await run_batch(engine, checks, "check")
        cases = [Case(r.prompt, o.token_ids) for r, o in zip(checks, done.outputs, strict=True)]
        return runs, cases
    finally:
        await engine.stop()


def throughput_report(
    plan: Plan, runs: dict[int, BatchRun], bandwidth: Bandwidth
) -> dict[str, Any]:
    mean_context = plan.prompt_len + plan.max_tokens / 2
    return {
        f"batch={batch}": {
            "requests": batch,
            "output_tokens": run.output_tokens,
            "seconds": run.seconds,
            "output_tokens_per_s": run.tokens_per_s,
            "median_ttft_ms": sorted(o.ttft_ms for o in run.outputs)[len(run.outputs) // 2],
            "decode": step_roofline(plan.shape, batch, mean_context, bandwidth, run.median_step_ms),
        }
        for batch, run in runs.items()
    }


def _graph_runs(plan: Plan, model_dir: Path) -> tuple[dict[int, BatchRun], list[Case]] | str:
    """The engine with CUDA graphs, or the error it raised: the first GPU run of this path
    must still report everything else (device time is scarce)."""
    try:
        return asyncio.run(measure_engine(plan, model_dir, cuda_graphs=True))
    except Exception as exc:  # reported in gpu.json, and the run then fails
        traceback.print_exc()
        return f"{type(exc).__name__}: {exc}"


def machine(device: str) -> dict[str, Any]:
    info: dict[str, Any] = {"platform": platform.platform(), "torch": torch.__version__}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        info |= {
            "gpu": props.name,
            "gpu_memory_bytes": props.total_memory,
            "cuda": torch.version.cuda,
            "compute_capability": f"{props.major}.{props.minor}",
        }
    return info


def run(plan: Plan, model_dir: Path) -> dict[str, Any]:
    began = time.perf_counter()
    bandwidth = copy_bandwidth(plan.device, plan.copy_buffer_bytes)
    build_checkpoint(plan.shape, model_dir, plan.device)
    runs, cases = asyncio.run(measure_engine(plan, model_dir, cuda_graphs=False))
    graphs = _graph_runs(plan, model_dir)
    if plan.device == "cuda":
        torch.cuda.empty_cache()
    case_sets = [cases, graphs[1]] if isinstance(graphs, tuple) else [cases]
    reports = check_against_transformers(model_dir, plan.device, case_sets)
    check = reports[0]
    if isinstance(graphs, tuple):
        graph_check = reports[1]
        check["cuda_graphs"] = graph_check
        check["passed"] = check["passed"] and graph_check["passed"]
        graph_throughput = throughput_report(plan, graphs[0], bandwidth)
    else:
        check["cuda_graphs"] = {"passed": False, "error": graphs}
        check["passed"] = False
        graph_throughput = {"error": graphs}
    return {
        "benchmark": "engine on GPU: bf16 correctness, throughput, decode roofline",
        "model": plan.shape.name,
        "parameters": plan.shape.parameter_count(),
        "dtype": "bfloat16",
        "device": plan.device,
        "dry_run": plan.shape == DRY.shape,
        "workload": {"prompt_tokens": plan.prompt_len, "max_tokens": plan.max_tokens},
        "copy_bandwidth_gb_per_s": bandwidth.bytes_per_s / 1e9,
        "copy_buffer_bytes": bandwidth.buffer_bytes,
        "throughput": throughput_report(plan, runs, bandwidth),
        # The same with decode-only steps as CUDA graphs (engine cuda_graphs; on CPU, with
        # --dry-run, the same fixed shapes run eagerly).
        "throughput_cuda_graphs": graph_throughput,
        "correctness": check,
        "seconds": time.perf_counter() - began,
        "machine": machine(plan.device),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dry-run", action="store_true", help="tiny model on CPU, same code")
    parser.add_argument(
        "--device",
        choices=("cpu", "cuda"),
        help="override the plan's device (--dry-run --device "
        "cuda: the tiny model on the GPU, a seconds-long smoke test before the full run)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results")
    parser.add_argument("--model-dir", type=Path, help="where the random checkpoint is built")
    args = parser.parse_args(argv)
    plan = DRY if args.dry_run else FULL
    if args.device:
        plan = replace(plan, device=args.device)
    if plan.device == "cuda" and not torch.cuda.is_available():
        print(f"bench/gpu/run.sh: {NO_CUDA}", file=sys.stderr)
        return 2
    model_dir = args.model_dir or ROOT / ".cache" / "models" / plan.shape.name
    summary = run(plan, model_dir)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / plan.result_name
    path.write_text(json.dumps(summary, indent=2) + "\n", "utf-8")
    print_summary(summary, path)
    return 0 if summary["correctness"]["passed"] else 1


def print_summary(summary: dict[str, Any], path: Path) -> None:
    print(f"{summary['model']} on {summary['device']}: copy bandwidth "
          f"{summary['copy_bandwidth_gb_per_s']:.1f} GB/s")  # fmt: skip
    for section in ("throughput", "throughput_cuda_graphs"):
        print(f"  {section}:")
        for name, row in summary[section].items():
            if name == "error":
                print(f"  {row}")
                continue
            decode = row["decode"]
            print(
                f"  {name:>9}: {row['output_tokens_per_s']:9.1f} tok/s, decode step "
                f"{decode['measured_step_ms']:.2f} ms vs roofline "
                f"{decode['roofline_step_ms']:.3f} ms ({decode['efficiency']:.1%})"
            )
    check = summary["correctness"]
    print(f"  correctness ({check['reference']}): {'passed' if check['passed'] else 'FAILED'}")
    _print_check("engine", check)
    graphs = check["cuda_graphs"]
    if "error" in graphs:
        print(f"  with cuda_graphs: FAILED ({graphs['error']})")
    else:
        _print_check("with cuda_graphs", graphs)
    print(f"wrote {path}")


def _print_check(name: str, check: dict[str, Any]) -> None:
    print(
        f"  {name}: top-1 vs float32 {check['engine_top1_vs_float32']:.3f} "
        f"(transformers-bf16 {check['transformers_bf16_top1_vs_float32']:.3f}), mean gap "
        f"{check['engine_mean_gap_vs_float32']:.3f} "
        f"({check['transformers_bf16_mean_gap_vs_float32']:.3f}); vs transformers-bf16: top-1 "
        f"{check['teacher_forced_top1_agreement']:.3f}, exact {check['exact_sequence_matches']}/"
        f"{check['cases']}"
    )


if __name__ == "__main__":
    sys.exit(main())
