"""The whole platform through Envoy vs the inference replica alone, and cache hits per second.

Starts the stack as `make up` does (free ports, its own Redis unless REDIS_URL is set), then:
1. the same completions (raw prompt, greedy, fixed length, response cache bypassed) sent
   through the edge (ext_authz, rate limit, router, tokenizer, billing, mesh), to the router's
   own port (with the identity the edge would add), and straight to a replica's Generate with
   the same prompt tokens, taking turns; the added latency at p50/p99 for concurrency 1 and 16,
   split into the edge's and the router's share; at concurrency 1 also the time to the first
   text each path's client sees (`first_text_ms`);
2. one deterministic request repeated through the edge: every answer an exact cache hit
   (timed once the first answer is stored; the median of a few rounds), served from the
   router's near cache; then, on a second stack started with the near cache off
   (ROUTER_NEAR_CACHE_ENTRIES=0), the same rounds again, every hit a cache-service lookup.
The machine's own floors (bench/machine.py) are recorded beside them.
Writes bench/results/stack.json and stack.png. Goals: <= 5 ms added at p50 (concurrency 1),
>= 300 cache-hit requests/s. Baseline: LiteLLM's published proxy overhead (12 ms median,
43 ms p99 on 2 instances).

Usage: python bench/bench_stack.py [--pairs 100] [--rounds 3] [--cache-seconds 5] [--cache-rounds 3]
       [--no-near-ab]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import AsyncIterable, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import machine

from llm_stack import catalogue
from llm_stack.config import StackConfig, free_ports
from llm_stack.demo import start_with_key
from llm_stack.stack import Endpoints, Stack
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as inf_pb
from llmapi.inference.v1 import inference_service_pb2_grpc as inf_grpc
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc
from llmapi.tokenizer.v1 import tokenizer_service_pb2 as tok_pb
from llmapi.tokenizer.v1 import tokenizer_service_pb2_grpc as tok_grpc

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MODEL = "demo-llama"
MAX_TOKENS = 16
TENANT = "demo"  # the tenant of the key the benchmark creates
SCOPES = "completion:write"
GOAL_ADDED_P50_MS = 5.0
GOAL_CACHE_RPS = 300.0
LITELLM = {
    "median_ms": 12.0,
    "p99_ms": 43.0,
    "source": "LiteLLM docs, proxy overhead on 2 instances",
}
NEAR_CACHE_VARIABLE = "ROUTER_NEAR_CACHE_ENTRIES"
FULL, ROUTER, DIRECT = "full", "router", "direct"
KINDS = (FULL, ROUTER, DIRECT)
Call = Callable[[int], Awaitable[float]]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def prompt(i: int, path: str = FULL) -> str:
    """Pair i's prompt on `path`. The edge and router paths get different texts (of the same
    token count): the router's token memo would otherwise spare whichever runs second its
    tokenizer call. The direct path sends the edge path's prompt tokens."""
    tag = "b" if path == ROUTER else "a"
    return f"Request {i}{tag}: tell me about the river, the mountain and the sea."


class Paths:
    """The two ways to run the same completion."""

    def __init__(
        self, endpoints: Endpoints, key: str, token_ids: dict[int, list[int]], replicas: list[str]
    ) -> None:
        self._edge = grpc.aio.insecure_channel(endpoints.edge_http)
        self._llm = pb_grpc.LLMServiceStub(self._edge)
        # The router's own port with the identity the edge would have added: the edge's share.
        self._router = pb_grpc.LLMServiceStub(grpc.aio.insecure_channel(endpoints.router))
        key_id = key.removeprefix("sk-").split(".")[0]
        self._identity = (("x-tenant-id", TENANT), ("x-key-id", key_id), ("x-scopes", SCOPES))
        self._replicas = [
            inf_grpc.InferenceServiceStub(grpc.aio.insecure_channel(a)) for a in replicas
        ]
        self._metadata = (("authorization", f"Bearer {key}"),)
        self._token_ids = token_ids
        self.first_text_ms: dict[str, list[float]] = {kind: [] for kind in KINDS}
        self.sampling = common_pb2.SamplingParams(
            max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True
        )

    def _completion(self, i: int, path: str) -> pb.CompleteStreamRequest:
        return pb.CompleteStreamRequest(
            model=MODEL,
            prompt=prompt(i, path),
            sampling=self.sampling,
            cache=pb.CachePolicy(bypass=True),
        )

    async def full(self, i: int) -> float:
        started = time.perf_counter()
        call = self._llm.CompleteStream(
            self._completion(i, FULL), metadata=self._metadata, timeout=120
        )
        return await self._consume(FULL, started, call)

    async def router(self, i: int) -> float:
        started = time.perf_counter()
        call = self._router.CompleteStream(
            self._completion(i, ROUTER), metadata=self._identity, timeout=120
        )
        return await self._consume(ROUTER, started, call)

    async def _consume(self, kind: str, started: float, call: AsyncIterable[Any]) -> float:
        """Read a stream to its end; its time to first text goes to `first_text_ms`."""
        first: float | None = None
        async for message in call:
            if first is None and (message.delta if kind != DIRECT else message.text_delta):
                first = time.perf_counter()
        self.first_text_ms[kind].append(((first or time.perf_counter()) - started) * 1000)
        return (time.perf_counter() - started) * 1000

    def call(self, kind: str) -> Call:
        return {FULL: self.full, ROUTER: self.router, DIRECT: self.direct}[kind]

    async def direct(self, i: int) -> float:
        request = inf_pb.GenerateRequest(
            request_id=f"bench-{i}-{time.monotonic_ns()}",
            prompt_token_ids=self._token_ids[i],
            sampling=self.sampling,
            detokenize=True,
        )
        stub = self._replicas[i % len(self._replicas)]
        started = time.perf_counter()
        return await self._consume(DIRECT, started, stub.Generate(request, timeout=120))

    async def cached(self) -> bool:
        request = pb.CompleteRequest(
            model=MODEL, prompt="The cached question.", sampling=self.sampling
        )
        reply = await self._llm.Complete(request, metadata=self._metadata, timeout=30)
        return bool(reply.cache.hit == pb.CACHE_HIT_EXACT)


async def tokenize(endpoints: Endpoints, count: int) -> dict[int, list[int]]:
    """Prompt token ids as the router sends them (the tokenizer's Encode of the raw prompt),
    checking that each pair's prompts are as long on the edge and router paths."""
    async with grpc.aio.insecure_channel(endpoints.grpc["tokenizer"]) as channel:
        stub = tok_grpc.TokenizerServiceStub(channel)

        async def encode(path: str) -> list[list[int]]:
            texts = [prompt(i, path) for i in range(count)]
            request = tok_pb.EncodeRequest(model=MODEL, texts=texts, add_special_tokens=True)
            reply = await stub.Encode(request, timeout=30)
            return [list(e.ids) for e in reply.encodings]

        full, router = await encode(FULL), await encode(ROUTER)
    if [len(ids) for ids in full] != [len(ids) for ids in router]:
        raise RuntimeError("the edge and router prompts differ in length")
    return dict(enumerate(full))


def _rotation(step: int) -> tuple[str, ...]:
    """The paths in an order that changes every step, so none always runs first."""
    shift = step % len(KINDS)
    return KINDS[shift:] + KINDS[:shift]


async def serial(paths: Paths, requests: int) -> dict[str, list[float]]:
    """Concurrency 1: the three paths take turns on the same prompt."""
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for i in range(requests):
        for kind in _rotation(i):
            times[kind].append(await paths.call(kind)(i))
    return times


async def concurrent_rounds(
    paths: Paths, rounds: int, concurrency: int, offset: int
) -> dict[str, list[float]]:
    """`concurrency` calls at once on one path, then the same prompts on the next path."""
    times: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for r in range(rounds):
        ids = [offset + r * concurrency + k for k in range(concurrency)]
        for kind in _rotation(r):
            call = paths.call(kind)
            times[kind] += await asyncio.gather(*(call(i) for i in ids))
    return times


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_by_process(pids: dict[str, int]) -> dict[str, float]:
    return {name: _cpu_s(pid) for name, pid in pids.items()}


async def cache_hits(
    paths: Paths, seconds: float, concurrency: int, pids: dict[str, int], rounds: int
) -> dict[str, Any]:
    """Repeat one request: every answer after the first is an exact hit. `rounds` rounds of
    `seconds` each (shared cores change speed within a minute: the median round is reported,
    every round kept), with where the CPU goes per request, by process (this benchmark's own
    client included)."""
    deadline = time.monotonic() + 30
    while not await paths.cached():  # the first generates the answer; its store lands later
        if time.monotonic() > deadline:
            raise RuntimeError("the repeated request never became a cache hit")
        await asyncio.sleep(0.05)
    runs = [await _hit_round(paths, seconds, concurrency, pids) for _ in range(rounds)]
    median = sorted(runs, key=lambda r: r["requests_per_s"])[len(runs) // 2]
    return {**median, "rounds": [_round_summary(r) for r in runs]}


def _round_summary(run: dict[str, Any]) -> dict[str, Any]:
    keys = ("requests_per_s", "requests", "exact_hits", "cpu_ms_per_request_total")
    return {k: run[k] for k in keys}


async def _hit_round(
    paths: Paths, seconds: float, concurrency: int, pids: dict[str, int]
) -> dict[str, Any]:
    stop = time.monotonic() + seconds
    counts = {"requests": 0, "hits": 0}
    pids = {**pids, "benchmark client": os.getpid()}
    cpu_before = _cpu_by_process(pids)

    async def worker() -> None:
        while time.monotonic() < stop:
            hit = await paths.cached()
            counts["requests"] += 1
            counts["hits"] += int(hit)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    cpu_after = _cpu_by_process(pids)
    per_request = {
        name: round((cpu_after[name] - cpu_before[name]) / max(1, counts["requests"]) * 1e3, 3)
        for name in pids
    }
    return {
        "concurrency": concurrency,
        "seconds": round(elapsed, 2),
        "requests": counts["requests"],
        "exact_hits": counts["hits"],
        "requests_per_s": round(counts["requests"] / elapsed, 1),
        "cpu_ms_per_request": dict(sorted(per_request.items(), key=lambda kv: -kv[1])),
        "cpu_ms_per_request_total": round(sum(per_request.values()), 3),
    }


def _quantiles(values: list[float]) -> dict[str, float]:
    return {"p50": round(statistics.median(values), 2), "p99": round(percentile(values, 99), 2)}


def _difference(a: list[float], b: list[float]) -> dict[str, float]:
    # paired_p50: the median of per-prompt differences (the two calls ran back to back on the
    # same prompt), steadier than the difference of medians when the cores are shared.
    return {
        "p50": round(statistics.median(a) - statistics.median(b), 2),
        "p99": round(percentile(a, 99) - percentile(b, 99), 2),
        "paired_p50": round(statistics.median(x - y for x, y in zip(a, b, strict=True)), 2),
    }


def summarize(times: dict[str, list[float]]) -> dict[str, Any]:
    """Latency per path; `added` = edge path minus the replica alone, split into the edge's
    share (Envoy, ext_authz, rate limit) and the router's (tokenizer, billing, mesh, ...)."""
    full, router, direct = times[FULL], times[ROUTER], times[DIRECT]
    return {
        "requests_per_path": len(full),
        "full_ms": _quantiles(full),
        "router_ms": _quantiles(router),
        "direct_ms": _quantiles(direct),
        "added_ms": _difference(full, direct),
        "edge_share_ms": _difference(full, router),
        "router_share_ms": _difference(router, direct),
    }


async def measure(
    endpoints: Endpoints,
    key: str,
    replicas: list[str],
    args: argparse.Namespace,
    pids: dict[str, int],
) -> dict[str, Any]:
    total = args.pairs + args.rounds * args.concurrency
    warmup = 4
    paths = Paths(endpoints, key, await tokenize(endpoints, total + warmup), replicas)
    for i in range(warmup):  # warm both paths (connections, first compilations)
        await paths.full(total + i)
        await paths.direct(total + i)
    serial_times = await serial(paths, args.pairs)
    # Time to the first text the client sees (the router's guard holds back an open tail).
    first_text = {kind: _quantiles(paths.first_text_ms[kind][-args.pairs :]) for kind in KINDS}
    parallel = await concurrent_rounds(paths, args.rounds, args.concurrency, args.pairs)
    cache = await cache_hits(paths, args.cache_seconds, args.concurrency, pids, args.cache_rounds)
    return {
        "concurrency_1": {**summarize(serial_times), "first_text_ms": first_text},
        f"concurrency_{args.concurrency}": summarize(parallel),
        "cache_hits": cache,
        "raw_ms": {"concurrency_1": serial_times, f"concurrency_{args.concurrency}": parallel},
    }


def stack_config(run_dir: Path) -> StackConfig:
    config = StackConfig.from_env(ROOT, {**os.environ, "LLM_RUN_DIR": str(run_dir)})
    replicas = catalogue.local_replicas(config.models_config)
    return dataclasses.replace(
        config.with_ports(free_ports(tuple(r.port for r in replicas))),
        redis_prefix=f"bench{os.getpid()}:",
        log_level="WARNING",  # per-request access logs would cost CPU the benchmark measures
    )


def run(
    config: StackConfig, args: argparse.Namespace, *, hits_only: bool = False
) -> dict[str, Any]:
    stack = Stack(config)
    try:
        endpoints, key = start_with_key(stack, tenant=TENANT, name="bench")
        # Direct calls go to the replicas of the generation model only.
        ports = catalogue.generation_ports(catalogue.local_replicas(config.models_config))
        replicas = [f"127.0.0.1:{config.ports.replica_port(p)}" for p in ports]
        pids = {p.spec.name: p.pid for p in stack.processes() if p.pid is not None}
        if hits_only:
            return asyncio.run(measure_hits(endpoints, key, replicas, args, pids))
        return asyncio.run(measure(endpoints, key, replicas, args, pids))
    finally:
        stack.stop()


async def measure_hits(
    endpoints: Endpoints,
    key: str,
    replicas: list[str],
    args: argparse.Namespace,
    pids: dict[str, int],
) -> dict[str, Any]:
    paths = Paths(endpoints, key, {}, replicas)
    return await cache_hits(paths, args.cache_seconds, args.concurrency, pids, args.cache_rounds)


def without_near_cache(args: argparse.Namespace) -> dict[str, Any]:
    """Cache hits on a stack whose routers ask the cache service every time."""
    saved = os.environ.get(NEAR_CACHE_VARIABLE)
    os.environ[NEAR_CACHE_VARIABLE] = "0"  # the supervisor passes its environment on
    try:
        with tempfile.TemporaryDirectory(prefix="bench-stack-") as run_dir:
            return run(stack_config(Path(run_dir)), args, hits_only=True)
    finally:
        if saved is None:
            del os.environ[NEAR_CACHE_VARIABLE]
        else:
            os.environ[NEAR_CACHE_VARIABLE] = saved


def plot(result: dict[str, Any], concurrency: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, name in zip(axes, ("concurrency_1", f"concurrency_{concurrency}"), strict=True):
        raw = result["raw_ms"][name]
        ax.boxplot([raw[DIRECT], raw[ROUTER], raw[FULL]], showfliers=False)
        ax.set_xticks([1, 2, 3], ["replica alone", "router port", "through the edge"])
        ax.set_title(f"{name.replace('_', ' ')}: completion of {MAX_TOKENS} tokens")
        ax.set_ylabel("ms")
    added = result["concurrency_1"]["added_ms"]["paired_p50"]
    fig.suptitle(
        f"added p50 (paired) {added} ms; cache hits {result['cache_hits']['requests_per_s']} req/s"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=100, help="concurrency-1 requests per path")
    parser.add_argument("--rounds", type=int, default=3, help="concurrent rounds per path")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--cache-seconds", type=float, default=5.0, help="per cache-hit round")
    parser.add_argument("--cache-rounds", type=int, default=3)
    parser.add_argument(
        "--no-near-ab", action="store_true", help="skip the cache-hit rounds without near cache"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "stack.json")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    watch = machine.Run()
    with tempfile.TemporaryDirectory(prefix="bench-stack-") as run_dir:
        result = run(stack_config(Path(run_dir)), args)
    if not args.no_near_ab:
        result["cache_hits_without_near_cache"] = without_near_cache(args)
    added = result["concurrency_1"]["added_ms"]["paired_p50"]
    rps = result["cache_hits"]["requests_per_s"]
    report = {
        "benchmark": "stack",
        "machine": {
            # Shared cores make every figure noisy; the load average says how busy they were.
            "load_average_1m_before": round(load_before, 2),
            "load_average_1m_after": round(os.getloadavg()[0], 2),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            **watch.report(),
        },
        "workload": {
            "model": MODEL,
            "max_tokens": MAX_TOKENS,
            "sampling": "greedy, ignore_eos",
            "prompts": "distinct per pair and per path (same token count)",
        },
        "goals": {"added_p50_ms_at_c1": GOAL_ADDED_P50_MS, "cache_hit_rps": GOAL_CACHE_RPS},
        # The added latency judged by the paired median (see _difference).
        "met": {"added_p50": added <= GOAL_ADDED_P50_MS, "cache_hit_rps": rps >= GOAL_CACHE_RPS},
        "baseline_litellm": LITELLM,
        **{k: v for k, v in result.items() if k != "raw_ms"},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    plot(result, args.concurrency, args.out.with_suffix(".png"))
    shown = ("met", "concurrency_1", "cache_hits", "cache_hits_without_near_cache")
    print(json.dumps({k: report[k] for k in shown if k in report}, indent=2))


if __name__ == "__main__":
    main()
