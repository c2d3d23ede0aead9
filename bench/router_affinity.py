"""bench_router part 2: prefix-affinity routing vs round-robin on shared prefixes."""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
from router_config import (
    AFFINITY_KV_MIB,
    ASKS_PER_PREFIX,
    CONCURRENCY,
    GOAL_TTFT_SPEEDUP,
    MODEL,
    PREFIX_WORDS,
    PREFIXES,
    WORDS,
)
from router_overhead import user_message
from router_procs import Proc, running, start_inference, start_router
from router_stats import Stats

from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc


@dataclass
class Workload:
    prefixes: list[str]
    order: list[tuple[int, str]]  # (prefix index, question)


def make_workload(seed: int) -> Workload:
    rng = random.Random(seed)
    prefixes = [
        f"System {p}. " + " ".join(rng.choice(WORDS) for _ in range(PREFIX_WORDS))
        for p in range(PREFIXES)
    ]
    order = [
        (p, f"Question {q} about {rng.choice(WORDS)}?")
        for p in range(PREFIXES)
        for q in range(ASKS_PER_PREFIX)
    ]
    rng.shuffle(order)
    return Workload(prefixes, order)


@dataclass
class RunResult:
    ttft_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0


async def run_workload(router: Proc, deps: dict[str, Any], workload: Workload) -> RunResult:
    result = RunResult()
    queue: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
    for item in workload.order:
        queue.put_nowait(item)
    sampling = common_pb2.SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    async with grpc.aio.insecure_channel(router.target) as channel:
        stub = pb_grpc.LLMServiceStub(channel)

        async def client() -> None:
            while not queue.empty():
                p, question = queue.get_nowait()
                messages = [
                    common_pb2.ChatMessage(
                        role=common_pb2.ROLE_SYSTEM, content=workload.prefixes[p]
                    ),
                    user_message(question),
                ]
                request = pb.ChatStreamRequest(
                    model=MODEL,
                    messages=messages,
                    sampling=sampling,
                    cache=pb.CachePolicy(bypass=True),
                )
                start, first = time.perf_counter(), None
                async for message in stub.ChatStream(request, metadata=deps["metadata"]):
                    if first is None and message.delta:
                        first = time.perf_counter() - start
                    if message.usage.prompt_tokens:
                        result.prompt_tokens += message.usage.prompt_tokens
                        result.cached_tokens += message.usage.cached_tokens
                result.ttft_s.append(first if first is not None else time.perf_counter() - start)

        await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
    return result


async def measure_affinity(deps: dict[str, Any], logdir: Path, work: Path) -> dict[str, Any]:
    modes: dict[str, Any] = {}
    samples: dict[str, list[float]] = {}
    for seed, (label, balancer) in enumerate(
        (("round_robin", "round_robin"), ("affinity", "expected_wait"))
    ):
        replicas = [
            start_inference(
                logdir, work, f"{label}-replica-{i}", prefix_caching=True, kv_mib=AFFINITY_KV_MIB
            )
            for i in range(2)
        ]
        async with running(replicas, logdir):
            router = start_router(
                logdir, work, f"router-{label}", deps, [r.target for r in replicas], balancer
            )
            async with running([router], logdir):
                await asyncio.sleep(0.5)  # first load reports
                result = await run_workload(router, deps, make_workload(seed=100 + seed))
        stats = Stats.of(result.ttft_s)
        samples[label] = result.ttft_s
        modes[label] = {
            "balancer": balancer,
            "ttft_ms": asdict(stats),
            "prefix_cache_hit_ratio": round(result.cached_tokens / max(1, result.prompt_tokens), 3),
        }
    speedup = modes["round_robin"]["ttft_ms"]["mean"] / modes["affinity"]["ttft_ms"]["mean"]
    return {
        "replicas": 2,
        "prefixes": PREFIXES,
        "asks_per_prefix": ASKS_PER_PREFIX,
        "requests": PREFIXES * ASKS_PER_PREFIX,
        "concurrency": CONCURRENCY,
        "kv_cache_mib_per_replica": AFFINITY_KV_MIB,
        **modes,
        "mean_ttft_speedup": round(speedup, 2),
        "goal_speedup": GOAL_TTFT_SPEEDUP,
        "goal_met": speedup >= GOAL_TTFT_SPEEDUP,
        "_samples": samples,
    }
