"""Router benchmark: what the full router path adds over calling inference directly, and how
much prefix-affinity routing improves TTFT over round-robin on a shared-prefix workload.

Everything runs as real processes on loopback: the tokenizer, auth, billing and cache services
(one process each, as deployed, on the real Redis), inference replicas (`python -m
llm_inference`, real engine on the demo checkpoint) and the router (`python -m llm_router`).
No Envoy.

1. Overhead, concurrency 1: the same chat requests (greedy, 4 tokens) through the router's Chat
   (tokenize, token quota, budget reserve, route, generate, guard, settle) and directly to the
   replica's Generate with the pre-tokenized prompt, taking turns; prefix caching off.
   `overhead` (the goal's verdict): the router as configured by default (ROUTER_TOKENIZE=
   speculate, its files attested by the tokenizer service, so prompts are counted in-process;
   token-quota leases) and the replica alone, nothing else running. `variants`: then the same
   router and five variants, all taking turns with the replica in one loop (each router's
   process is idle while the others are served, which costs each of them): speculation
   confirmed by the service on every request (attestation off, the default before it);
   admission before the cache lookup and generation instead of alongside them; waiting for
   the tokenizer service before anything starts (ROUTER_TOKENIZE=service, the default before
   speculation); tokenization in-process only (ROUTER_TOKENIZE=auto); and one message per
   token from the replica (ROUTER_*TOKENS_PER_MESSAGE=1, the default before token grouping;
   the direct path always gets one per token). Beside them, the
   router's call pattern with no logic at all (grpc_skeleton.py): grpc-python's own floor.
2. Shared prefixes on 2 replicas: 8 long system prompts, each asked 6 questions in shuffled
   order by 2 concurrent clients; KV memory per replica holds about half the prefixes. Mean
   time to first token with the router's expected-wait + prefix-affinity selection vs its
   round-robin baseline (replicas restarted cold for each).

Writes bench/results/router.json and router.png.
Usage: python bench/bench_router.py [--model-root .cache/models] [--requests 200]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import machine
from router_affinity import measure_affinity
from router_config import GOAL_ADDED_P50_MS, RESULTS, ROOT
from router_deps import DEP_SERVICES, serve_dep, start_deps
from router_overhead import measure_overhead, measure_skeleton, measure_variants
from router_procs import running, start_inference, start_router, stop, wait_attested, write_models
from router_report import machine_info, plot, strip_samples


def _demo_checkpoint(model_root: Path) -> Path:
    name = "build_demo_model"
    spec = importlib.util.spec_from_file_location(
        name, ROOT / "infra" / "model" / "build_demo_model.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    built: Path = module.build(model_root / "demo-llama")
    return built


async def run(args: argparse.Namespace) -> dict[str, Any]:
    checkpoint = _demo_checkpoint(args.model_root.resolve())
    with tempfile.TemporaryDirectory(prefix="bench-router-") as tmp:
        work = Path(tmp)
        (work / "demo-llama").symlink_to(checkpoint)
        write_models(work / "models.yaml", work / "demo-llama", [])
        logdir = args.logdir or work
        logdir.mkdir(parents=True, exist_ok=True)
        deps_procs, deps = start_deps(logdir, work)
        try:
            replica = start_inference(
                logdir, work, "overhead-replica", prefix_caching=False, kv_mib=16
            )
            async with running([replica], logdir):
                targets = [replica.target]
                default = start_router(logdir, work, "router", deps, targets, "expected_wait")
                async with running([default], logdir):
                    await wait_attested(default)
                    # The goal's verdict: the default router and the replica alone, taking
                    # turns, before the variants start (their requests in between would
                    # leave every router's process cold for each of its own).
                    goal = await measure_overhead(
                        deps, {"router": default}, replica, args.requests, "G"
                    )
                    goal["goal_added_p50_ms"] = GOAL_ADDED_P50_MS
                    goal["goal_met"] = goal["router"]["added_ms"]["p50"] <= GOAL_ADDED_P50_MS
                    overhead = await measure_variants(deps, work, logdir, default, replica, args)
            affinity = await measure_affinity(deps, logdir, work)
        finally:
            for proc in deps_procs:
                stop(proc)
    goal["grpc_skeleton"] = await measure_skeleton(args.requests)
    return {"overhead": goal, "variants": overhead, "prefix_affinity": affinity}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-root", type=Path, default=ROOT / ".cache" / "models")
    parser.add_argument("--requests", type=int, default=200, help="overhead requests per path")
    parser.add_argument("--out", type=Path, default=RESULTS / "router.json")
    parser.add_argument("--logdir", type=Path, help="keep the services' logs here")
    parser.add_argument("--deps", help=argparse.SUPPRESS)  # internal: run a helper process
    parser.add_argument("--dep", choices=DEP_SERVICES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.deps:
        asyncio.run(serve_dep(args.dep, json.loads(args.deps)))
        return 0
    load_before = os.getloadavg()
    watch = machine.Run()
    result = asyncio.run(run(args))
    overhead = result["overhead"]
    overhead["machine_floor"] = machine.floor_note(
        GOAL_ADDED_P50_MS,
        overhead["grpc_skeleton"]["added_p50_ms"],
        "added p50 of the router's call pattern with no logic (grpc_skeleton), same run",
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot(result, args.out.with_suffix(".png"))
    about = machine_info(load_before) | watch.report()
    report = {"benchmark": "router", "machine": about, **strip_samples(result)}
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
