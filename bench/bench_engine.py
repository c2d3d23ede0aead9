"""Inference engine: continuous batching vs transformers generate, prefix-cache TTFT, RSS, int8.

On the demo checkpoint, in one process and one run:
- throughput: 64 greedy requests (prompts 16-512 tokens, outputs 16-256, EOS ignored so the
  lengths are as planned) submitted at once to the engine, vs transformers `generate` over the
  same requests in static left-padded batches (each batch runs to its longest output); both
  run at each torch thread count and each side is judged at its best setting; engine runs
  are interleaved with the transformers runs (median counts) and CPU-time rates are reported
  next to wall-clock, as the machine may be shared;
- shared prefix: 32 requests sharing a 384-token system prompt, mean TTFT with and without
  prefix caching, both submitted at once (burst) and one after another (sequential);
- memory: RSS over 2,000 sequential short requests;
- int8: logit error and greedy agreement of weight-only int8 against float32.
Writes bench/results/engine.json and engine.png.

Usage: python bench/bench_engine.py [--model-root .cache/models] [--threads 1,2]
       [--hf-batch-sizes 64] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import random
import resource
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from llm_inference.engine.accuracy import compare_engines
from llm_inference.engine.api import FinishReason, SamplingOptions, TokenEvent
from llm_inference.engine.config import EngineConfig
from llm_inference.engine.core import EngineCore
from llm_inference.engine.engine import AsyncEngine

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MODEL = "demo-llama"
FIRST_ID = 6  # ids below are special tokens of the demo tokenizer
KV_BUDGET = 512 << 20
GOAL_THROUGHPUT_RATIO = 3.0
GOAL_TTFT_RATIO = 3.0
GOAL_RSS_DRIFT = 0.05


@dataclass(frozen=True, slots=True)
class Request:
    prompt: list[int]
    max_tokens: int


@dataclass(frozen=True, slots=True)
class RunResult:
    output_tokens: int
    seconds: float
    cpu_seconds: float  # process CPU time: less sensitive than wall time to other tenants
    ttft_ms: list[float]

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds

    @property
    def tokens_per_cpu_s(self) -> float:
        return self.output_tokens / self.cpu_seconds


def mixed_requests(count: int, seed: int, vocab: int) -> list[Request]:
    rng = random.Random(seed)
    return [
        Request(
            [rng.randrange(FIRST_ID, vocab) for _ in range(rng.randint(16, 512))],
            rng.randint(16, 256),
        )
        for _ in range(count)
    ]


def shared_prefix_requests(count: int, seed: int, vocab: int) -> list[Request]:
    rng = random.Random(seed)
    system = [rng.randrange(FIRST_ID, vocab) for _ in range(384)]
    return [
        Request(system + [rng.randrange(FIRST_ID, vocab) for _ in range(rng.randint(8, 64))], 16)
        for _ in range(count)
    ]


def greedy(max_tokens: int) -> SamplingOptions:
    return SamplingOptions(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False
    )


async def _consume(engine: AsyncEngine, request_id: str, request: Request) -> TokenEvent:
    last: TokenEvent | None = None
    count = 0
    async for event in engine.generate(request_id, request.prompt, greedy(request.max_tokens)):
        count += len(event.token_ids)
        last = event
    if last is None or last.finish_reason is not FinishReason.LENGTH or count != request.max_tokens:
        raise RuntimeError(f"{request_id}: {count} tokens, last event {last}")
    return last


async def run_burst(engine: AsyncEngine, requests: Sequence[Request], tag: str) -> RunResult:
    """All requests submitted at once; wall time until the last one finishes."""
    start, cpu = time.perf_counter(), time.process_time()
    finals = await asyncio.gather(
        *(_consume(engine, f"{tag}-{i}", r) for i, r in enumerate(requests))
    )
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    ttft = [f.timings.ttft_ms for f in finals if f.timings is not None]
    return RunResult(sum(r.max_tokens for r in requests), seconds, cpu, ttft)


async def run_sequential(engine: AsyncEngine, requests: Sequence[Request], tag: str) -> RunResult:
    start, cpu = time.perf_counter(), time.process_time()
    ttft = []
    for i, request in enumerate(requests):
        final = await _consume(engine, f"{tag}-{i}", request)
        if final.timings is not None:
            ttft.append(final.timings.ttft_ms)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return RunResult(sum(r.max_tokens for r in requests), seconds, cpu, ttft)


def engine_config(prefix_caching: bool = True) -> EngineConfig:
    return EngineConfig(kv_cache_memory_bytes=KV_BUDGET, enable_prefix_caching=prefix_caching)


async def with_engine(model_dir: Path, config: EngineConfig) -> AsyncEngine:
    engine = AsyncEngine.from_checkpoint(model_dir, config, MODEL)
    await engine.start()
    await run_sequential(engine, [Request(list(range(FIRST_ID, 40)), 4)], "warmup")
    return engine


async def bench_throughput(model_dir: Path, requests: Sequence[Request]) -> RunResult:
    engine = await with_engine(model_dir, engine_config())
    try:
        return await run_burst(engine, requests, "tput")
    finally:
        await engine.stop()


async def _prefix_run(
    model_dir: Path, requests: Sequence[Request], caching: bool, mode: str
) -> tuple[RunResult, float]:
    """One fresh engine (empty cache) per run: the shared system prompt is computed once."""
    engine = await with_engine(model_dir, engine_config(caching))
    try:
        run_mode = run_burst if mode == "burst" else run_sequential
        result = await run_mode(engine, requests, mode)
        return result, engine.load().prefix_cache_hit_rate
    finally:
        await engine.stop()


async def bench_prefix(model_dir: Path, requests: Sequence[Request], rounds: int) -> dict[str, Any]:
    """Mean TTFT with and without prefix caching, burst and sequential; median of rounds."""
    results: dict[str, Any] = {"with_cache": {}, "without_cache": {}, "rounds": rounds}
    for mode in ("burst", "sequential"):
        samples: dict[bool, list[tuple[RunResult, float]]] = {True: [], False: []}
        for _ in range(rounds):
            for caching in (True, False):
                samples[caching].append(await _prefix_run(model_dir, requests, caching, mode))
        for caching, runs in samples.items():
            runs.sort(key=lambda run: statistics.fmean(run[0].ttft_ms))
            median, hit_rate = runs[len(runs) // 2]
            key = "with_cache" if caching else "without_cache"
            results[key][mode] = {
                **summarize_run(median),
                "prefix_cache_hit_rate": hit_rate,
                "rounds_mean_ttft_ms": [statistics.fmean(r.ttft_ms) for r, _ in runs],
            }
        with_cache = results["with_cache"][mode]["mean_ttft_ms"]
        without = results["without_cache"][mode]["mean_ttft_ms"]
        results[f"{mode}_ttft_ratio"] = without / with_cache
    return results


def rss_bytes() -> int:
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


async def bench_rss(model_dir: Path, total: int, vocab: int) -> dict[str, Any]:
    engine = await with_engine(model_dir, engine_config())
    rng = random.Random(7)
    samples: list[tuple[int, int]] = []
    warmup = total // 10
    try:
        for i in range(total):
            prompt = [rng.randrange(FIRST_ID, vocab) for _ in range(rng.randint(8, 48))]
            await _consume(engine, f"rss-{i}", Request(prompt, rng.randint(1, 8)))
            if i + 1 >= warmup and (i + 1) % (total // 20) == 0:
                gc.collect()
                samples.append((i + 1, rss_bytes()))
    finally:
        await engine.stop()
    first, last = samples[0][1], samples[-1][1]
    peak = max(s for _, s in samples)
    return {
        "requests": total,
        "warmup_requests": warmup,
        "samples": [{"requests": n, "rss_mib": s / 2**20} for n, s in samples],
        "rss_first_mib": first / 2**20,
        "rss_last_mib": last / 2**20,
        "drift": (last - first) / first,
        "max_excursion": (peak - first) / first,
    }


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


def summarize_run(result: RunResult) -> dict[str, Any]:
    ttft = sorted(result.ttft_ms)
    summary: dict[str, Any] = {
        "output_tokens": result.output_tokens,
        "seconds": result.seconds,
        "cpu_seconds": result.cpu_seconds,
        "output_tokens_per_s": result.tokens_per_s,
        "output_tokens_per_cpu_s": result.tokens_per_cpu_s,
    }
    if ttft:
        summary |= {
            "mean_ttft_ms": statistics.fmean(ttft),
            "p50_ttft_ms": ttft[len(ttft) // 2],
            "p90_ttft_ms": ttft[int(len(ttft) * 0.9)],
            "ttft_ms": ttft,
        }
    return summary


def machine_info(thread_counts: Sequence[int]) -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "torch_thread_counts": list(thread_counts),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default (active)"),
        "load_average_1m_at_start": os.getloadavg()[0],
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tput = summary["throughput"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    results = [(f"engine\n{k}", r) for k, r in tput["engine"].items()] + [
        (f"HF generate\n{k.replace(',', chr(10))}", r) for k, r in tput["transformers"].items()
    ]
    colors = ["tab:blue"] * len(tput["engine"]) + ["tab:gray"] * len(tput["transformers"])
    bars = axes[0].bar(
        [name for name, _ in results], [r["output_tokens_per_s"] for _, r in results], color=colors
    )
    axes[0].bar_label(bars, fmt="%.0f")
    axes[0].set_ylabel("output tokens / s")
    axes[0].tick_params(axis="x", labelsize=7)
    axes[0].set_title(f"{tput['requests']} mixed requests: best {tput['ratio']:.1f}x transformers")
    axes[1].hist(tput["best_engine"]["ttft_ms"], bins=16, color="tab:blue")
    axes[1].set_xlabel("time to first token (ms)")
    axes[1].set_ylabel("requests")
    axes[1].set_title("engine TTFT, 64 requests submitted at once")
    prefix = summary["shared_prefix"]
    modes = ["burst", "sequential"]
    width = 0.38
    xs = range(len(modes))
    for offset, key, color in (
        (-width / 2, "with_cache", "tab:blue"),
        (width / 2, "without_cache", "tab:gray"),
    ):
        heights = [prefix[key][m]["mean_ttft_ms"] for m in modes]
        drawn = axes[2].bar([x + offset for x in xs], heights, width, label=key, color=color)
        axes[2].bar_label(drawn, fmt="%.0f")
    axes[2].set_xticks(list(xs), [f"{m}\n{prefix[f'{m}_ttft_ratio']:.1f}x lower" for m in modes])
    axes[2].set_ylabel("mean TTFT (ms)")
    axes[2].set_title("32 requests sharing a 384-token prefix")
    axes[2].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def bench_throughput_grid(
    model_dir: Path,
    requests: Sequence[Request],
    thread_counts: Sequence[int],
    hf_batch_sizes: Sequence[int],
) -> dict[str, Any]:
    """Engine and transformers at each thread count; each side is judged at its best setting.

    Engine runs are interleaved with the transformers runs and their median counts, so a burst
    of load from other tenants of a shared machine does not land on one side only.
    """
    engine: dict[int, list[RunResult]] = {}
    hf: dict[tuple[int, int], RunResult] = {}
    for threads in thread_counts:
        torch.set_num_threads(threads)
        runs = [asyncio.run(bench_throughput(model_dir, requests))]
        for batch_size in hf_batch_sizes:
            hf[threads, batch_size] = bench_transformers(model_dir, requests, batch_size)
            runs.append(asyncio.run(bench_throughput(model_dir, requests)))
        if len(runs) % 2 == 0:
            runs.append(asyncio.run(bench_throughput(model_dir, requests)))
        engine[threads] = sorted(runs, key=lambda r: r.tokens_per_s)
    medians = {t: runs[len(runs) // 2] for t, runs in engine.items()}
    engine_threads = max(medians, key=lambda t: medians[t].tokens_per_s)
    hf_key = max(hf, key=lambda k: hf[k].tokens_per_s)
    best_engine, best_hf = medians[engine_threads], hf[hf_key]
    return {
        "requests": len(requests),
        "prompt_tokens": sum(len(r.prompt) for r in requests),
        "output_tokens": sum(r.max_tokens for r in requests),
        "engine": {
            f"threads={t}": {**summarize_run(m), "runs_output_tokens_per_s": _rates(engine[t])}
            for t, m in medians.items()
        },
        "transformers": {f"threads={t},batch={b}": summarize_run(r) for (t, b), r in hf.items()},
        "best_engine": {"threads": engine_threads, **summarize_run(best_engine)},
        "best_transformers": {
            "threads": hf_key[0],
            "batch_size": hf_key[1],
            **summarize_run(best_hf),
        },
        "ratio": best_engine.tokens_per_s / best_hf.tokens_per_s,
        # The same comparison in CPU time, which other tenants' load disturbs less.
        "cpu_time_ratio": best_engine.tokens_per_cpu_s / best_hf.tokens_per_cpu_s,
    }


def _rates(runs: Sequence[RunResult]) -> list[float]:
    return [r.tokens_per_s for r in runs]


def run(
    model_dir: Path, thread_counts: Sequence[int], quick: bool, hf_batch_sizes: Sequence[int]
) -> dict[str, Any]:
    vocab = int(json.loads((model_dir / "config.json").read_text("utf-8"))["vocab_size"])
    machine = machine_info(thread_counts)
    mixed = mixed_requests(16 if quick else 64, seed=0, vocab=vocab)
    sections: dict[str, float] = {}
    with timed(sections, "throughput"):
        throughput = bench_throughput_grid(model_dir, mixed, thread_counts, hf_batch_sizes)
    torch.set_num_threads(throughput["best_engine"]["threads"])
    with timed(sections, "shared_prefix"):
        requests = shared_prefix_requests(32, 1, vocab)
        prefix = asyncio.run(bench_prefix(model_dir, requests, rounds=1 if quick else 3))
    with timed(sections, "rss"):
        rss = asyncio.run(bench_rss(model_dir, 200 if quick else 2000, vocab))
    with timed(sections, "int8"):
        int8 = bench_int8(model_dir, vocab)
    return {
        "benchmark": "inference engine vs transformers generate (static padded batches)",
        "model": MODEL,
        "dtype": "float32",
        "device": "cpu",
        "throughput": throughput,
        "shared_prefix": prefix,
        "rss": rss,
        "int8": int8,
        "goals": {
            "throughput_ratio": goal(throughput["ratio"], GOAL_THROUGHPUT_RATIO, higher=True),
            "prefix_ttft_ratio_burst": goal(
                prefix["burst_ttft_ratio"], GOAL_TTFT_RATIO, higher=True
            ),
            "prefix_ttft_ratio_sequential": goal(
                prefix["sequential_ttft_ratio"], GOAL_TTFT_RATIO, higher=True
            ),
            "rss_drift": goal(abs(rss["drift"]), GOAL_RSS_DRIFT, higher=False),
        },
        "section_seconds": sections,
        "machine": machine,
    }


@contextlib.contextmanager
def timed(sections: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        sections[name] = time.perf_counter() - start


def goal(value: float, target: float, *, higher: bool) -> dict[str, Any]:
    return {"value": value, "target": target, "met": value >= target if higher else value <= target}


def print_summary(summary: dict[str, Any]) -> None:
    tput = summary["throughput"]
    rows = [(f"engine, {k}", r) for k, r in tput["engine"].items()] + [
        (f"transformers generate, {k}", r) for k, r in tput["transformers"].items()
    ]
    for name, result in rows:
        print(
            f"{name}: {result['output_tokens_per_s']:,.0f} output tok/s "
            f"({result['output_tokens_per_cpu_s']:,.0f} per CPU-second)"
        )
    print(f"best vs best: {tput['ratio']:.2f}x wall, {tput['cpu_time_ratio']:.2f}x CPU time")
    prefix = summary["shared_prefix"]
    for mode in ("burst", "sequential"):
        with_cache = prefix["with_cache"][mode]["mean_ttft_ms"]
        without = prefix["without_cache"][mode]["mean_ttft_ms"]
        print(f"shared prefix ({mode}): mean TTFT {with_cache:.1f} ms cached vs {without:.1f} ms")
    rss = summary["rss"]
    print(f"RSS {rss['rss_first_mib']:.1f} -> {rss['rss_last_mib']:.1f} MiB ({rss['drift']:+.2%})")
    int8 = summary["int8"]
    print(
        f"int8: top-1 agreement {int8['top1_agreement']:.1%}, "
        f"max |logit error| {int8['max_abs_logit_error']:.4f}"
    )
    for name, result in summary["goals"].items():
        print(
            f"goal {name}: {result['value']:.3f} vs {result['target']} -> "
            f"{'met' if result['met'] else 'NOT met'}"
        )


def ensure_passive_openmp() -> None:
    """Re-exec with OMP_WAIT_POLICY=PASSIVE unless the caller chose a policy.

    OpenMP threads spin while they wait by default; on a machine shared with other processes a
    descheduled thread then stalls every parallel region (10x slower steps were measured on a
    loaded 2-core VM). The policy is read when torch loads, hence the re-exec.
    """
    if "OMP_WAIT_POLICY" not in os.environ:
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model-root", type=Path, default=ROOT / ".cache" / "models")
    parser.add_argument("--threads", default="1,2", help="torch thread counts to try, both sides")
    parser.add_argument("--hf-batch-sizes", default="64", help="static batch sizes to try")
    parser.add_argument("--quick", action="store_true", help="smaller workload (smoke test)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if argv is None:
        ensure_passive_openmp()
    model_dir = (args.model_root / MODEL).resolve()
    if not (model_dir / "config.json").is_file():
        print(f"no demo checkpoint at {model_dir}: run `make model` first", file=sys.stderr)
        return 2
    sizes = [int(s) for s in args.hf_batch_sizes.split(",") if s.strip()]
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    summary = run(model_dir, threads, args.quick, sizes)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engine.json").write_text(json.dumps(summary, indent=2) + "\n", "utf-8")
    plot(summary, args.out / "engine.png")
    print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
