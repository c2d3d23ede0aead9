"""bench_router part 1: what the router path adds over the replica alone, and its variants."""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import grpc
import grpc_skeleton
from router_config import MODEL, OVERHEAD_MAX_TOKENS, WORDS
from router_procs import Proc, phase_means_ms, running, start_router
from router_stats import Stats

from llm_testing import free_port
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as inf_pb
from llmapi.inference.v1 import inference_service_pb2_grpc as inf_grpc
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc
from llmapi.tokenizer.v1 import tokenizer_service_pb2 as tok_pb
from llmapi.tokenizer.v1 import tokenizer_service_pb2_grpc as tok_grpc


def user_message(text: str) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure_skeleton(requests: int) -> dict[str, Any]:
    """The same call pattern with no logic (grpc_skeleton): the floor under the router."""
    leaf_port, middle_port = free_port(), free_port()
    leaf = grpc_skeleton.spawn("leaf", leaf_port)
    middle = grpc_skeleton.spawn("middle", middle_port, leaf_port)
    try:
        cpu_before = process_cpu_s(middle.pid)
        result: dict[str, Any] = await grpc_skeleton.measure(leaf_port, middle_port, requests)
        result["middle_cpu_ms_per_request"] = round(
            (process_cpu_s(middle.pid) - cpu_before) / (requests + 50) * 1e3, 3
        )
    finally:
        for process in (middle, leaf):
            process.terminate()
            process.wait()
    return result


async def measure_overhead(
    deps: dict[str, Any], routers: dict[str, Proc], replica: Proc, requests: int, tag: str
) -> dict[str, Any]:
    """Each round sends one request on every path (direct and each router), in random order.
    `tag` keeps each measurement's prompts apart from every other's (no cache hits)."""
    sampling = common_pb2.SamplingParams(
        temperature=0.0, max_tokens=OVERHEAD_MAX_TOKENS, ignore_eos=True
    )
    rng = random.Random(7)
    prompts = overhead_prompts(rng, list(routers), requests + 20, tag)
    async with contextlib.AsyncExitStack() as stack:
        channels = {
            name: await stack.enter_async_context(grpc.aio.insecure_channel(p.target))
            for name, p in routers.items()
        }
        inference = inf_grpc.InferenceServiceStub(
            await stack.enter_async_context(grpc.aio.insecure_channel(replica.target))
        )
        tokenizer = tok_grpc.TokenizerServiceStub(
            await stack.enter_async_context(grpc.aio.insecure_channel(deps["tokenizer"]))
        )
        ids = [
            list(
                (
                    await tokenizer.ApplyChatTemplate(
                        tok_pb.ApplyChatTemplateRequest(
                            model=MODEL, messages=[user_message(p)], add_generation_prompt=True
                        )
                    )
                ).token_ids
            )
            for p in prompts["direct"]
        ]

        async def via_router(name: str, i: int) -> float:
            stub = pb_grpc.LLMServiceStub(channels[name])
            start = time.perf_counter()
            reply = await stub.Chat(
                pb.ChatRequest(
                    model=MODEL, messages=[user_message(prompts[name][i])], sampling=sampling
                ),
                metadata=deps["metadata"],
            )
            assert reply.usage.completion_tokens == OVERHEAD_MAX_TOKENS
            return time.perf_counter() - start

        async def direct(i: int) -> float:
            start = time.perf_counter()
            request = inf_pb.GenerateRequest(
                request_id=uuid.uuid4().hex,
                prompt_token_ids=ids[i],
                sampling=sampling,
                detokenize=True,
            )
            tokens = sum([len(m.token_ids) async for m in inference.Generate(request)])
            assert tokens == OVERHEAD_MAX_TOKENS
            return time.perf_counter() - start

        async def run(path: str, i: int) -> float:
            return await (direct(i) if path == "direct" else via_router(path, i))

        paths = ["direct", *routers]
        for i in range(20):  # warm-up: connections, code paths, the engine
            for path in paths:
                await run(path, i)
        cpu_before = {name: process_cpu_s(p.process.pid) for name, p in routers.items()}
        samples: dict[str, list[float]] = {path: [] for path in paths}
        for i in range(20, 20 + requests):
            for path in rng.sample(paths, len(paths)):
                samples[path].append(await run(path, i))
        cpu = {
            name: (process_cpu_s(p.process.pid) - cpu_before[name]) / requests
            for name, p in routers.items()
        }
    return overhead_report(samples, cpu, requests, cache_service=bool(deps.get("cache")))


def overhead_prompts(
    rng: random.Random, routers: list[str], count: int, tag: str
) -> dict[str, list[str]]:
    """One prompt variant per router: routers share the response cache and must not hit each
    other's entries. The direct path sends the first router's prompts."""
    words = [rng.choice(WORDS) for _ in range(count)]
    prompts = {
        name: [
            f"Question {tag}{chr(65 + n)}{i}: how far is the {w} from here?"
            for i, w in enumerate(words)
        ]
        for n, name in enumerate(routers)
    }
    prompts["direct"] = prompts[routers[0]]
    return prompts


def overhead_report(
    samples: dict[str, list[float]], cpu: dict[str, float], requests: int, *, cache_service: bool
) -> dict[str, Any]:
    """Latency of each path, what each router adds to the direct path, its CPU per request."""
    direct_stats = Stats.of(samples["direct"])
    report: dict[str, Any] = {
        "requests_per_path": requests,
        "concurrency": 1,
        "max_tokens": OVERHEAD_MAX_TOKENS,
        "cache_service": cache_service,
        "direct_ms": asdict(direct_stats),
    }
    for name in cpu:
        stats = Stats.of(samples[name])
        paired = Stats.of([r - d for r, d in zip(samples[name], samples["direct"], strict=True)])
        report[name] = {
            "latency_ms": asdict(stats),
            "added_ms": {
                "p50": round(stats.p50 - direct_stats.p50, 3),
                "p99": round(stats.p99 - direct_stats.p99, 3),
                "paired_p50": paired.p50,
            },
            "router_cpu_ms_per_request": round(cpu[name] * 1e3, 3),
        }
    report["_samples"] = samples
    return report


async def measure_variants(
    deps: dict[str, Any],
    work: Path,
    logdir: Path,
    default: Proc,
    replica: Proc,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The default router beside its variants, all interleaved with the replica alone."""

    def variant(name: str, **env: str) -> Proc:
        return start_router(logdir, work, name, deps, [replica.target], "expected_wait", **env)

    routers = {
        "router": default,
        "router_unattested": variant("router-unattested", ROUTER_TOKENIZER_ATTEST_INTERVAL_S="0"),
        "router_sequential_admission": variant(
            "router-sequential", ROUTER_OVERLAP_ADMISSION="false"
        ),
        "router_tokenize_service": variant("router-tokenize-service", ROUTER_TOKENIZE="service"),
        "router_tokenize_in_process": variant("router-tokenize-in-process", ROUTER_TOKENIZE="auto"),
        "router_per_token": variant(
            "router-per-token", ROUTER_TOKENS_PER_MESSAGE="1", ROUTER_UNARY_TOKENS_PER_MESSAGE="1"
        ),
    }
    variants = [p for name, p in routers.items() if name != "router"]
    async with running(variants, logdir):
        overhead = await measure_overhead(deps, routers, replica, args.requests, "V")
        for name, router in routers.items():
            assert router.metrics_port is not None
            overhead[name]["phase_mean_ms"] = phase_means_ms(router.metrics_port)
    return overhead
