"""Mesh policy hot reload under traffic: streams through the edge while two policy changes
are applied to the running Envoy (`llm_envoy.apply`, what `make mesh-apply` runs).

Starts the stack as `make up` does (free ports), keeps `--concurrency` CompleteStream calls
in flight through the edge on one gRPC channel, and after `--apply-after` and twice that many
finished streams applies, in turn,
1. a tighter circuit breaker on the router cluster (max_requests, pending, retry budget),
   with its health-check timeout (`--hc-timeout-s`, default 5 s: see _first_check),
2. changed retries on the edge's streaming and unary routes (attempts, back-off),
each read back from Envoy's `/config_dump` once live. Counts failed streams (any gRPC
error), streams in flight at each swap, and whether the client had to reconnect
(`downstream_cx_total` of the edge listener) or Envoy restarted (its pid and uptime).
Baseline: a reload by restart (what changing a timeout took before) drops every open
stream; the goal is 0 failed of >= 200.

Writes bench/results/mesh_reload.json.
Usage: python bench/bench_mesh_reload.py [--requests 240] [--concurrency 8] [--apply-after 60]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
import yaml

from llm_envoy import apply, live, mesh_view
from llm_stack import catalogue
from llm_stack.config import StackConfig, free_ports
from llm_stack.demo import start_with_key
from llm_stack.stack import Stack
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
POLICY = ROOT / "infra" / "envoy" / "policy.yaml"
MODEL = "demo-llama"
MAX_TOKENS = 24
GOAL_REQUESTS = 200
BREAKER = {
    "clusters": {
        "router": {
            "circuit_breakers": {
                "max_requests": 64,
                "max_pending_requests": 32,
                "retry_budget_percent": 10,
            }
        }
    }
}
RETRIES = {
    "edge_routes": {
        "streaming": {"retry": {"num_retries": 1, "backoff_base_s": 0.1, "backoff_max_s": 1}},
        "unary": {"retry": {"num_retries": 3, "backoff_base_s": 0.02, "backoff_max_s": 0.2}},
    }
}
BREAKER_CHANGE = "tighten the router cluster's breaker"
RETRIES_CHANGE = "edge retries: streaming 1 retry, unary 3, new back-off"


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        return {**base, **{k: _merge(base.get(k), v) for k, v in over.items()}}
    return over


@dataclasses.dataclass
class Traffic:
    """Streams through the edge on one channel; counts and in-flight gauge."""

    channel: grpc.aio.Channel
    key: str
    done: int = 0
    failed: int = 0
    in_flight: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)

    async def one(self, i: int) -> None:
        stub = pb_grpc.LLMServiceStub(self.channel)
        request = pb.CompleteStreamRequest(
            model=MODEL,
            prompt=f"Request {i}: tell me about the mesh.",
            sampling=common_pb2.SamplingParams(
                max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True
            ),
            cache=pb.CachePolicy(bypass=True),
        )
        metadata = (("authorization", f"Bearer {self.key}"),)
        self.in_flight += 1
        try:
            finished = False
            async for message in stub.CompleteStream(request, metadata=metadata, timeout=120):
                finished = finished or message.HasField("usage")
            if not finished:
                raise RuntimeError("stream ended without its final usage message")
        except (grpc.aio.AioRpcError, RuntimeError) as exc:
            self.failed += 1
            self.errors.append(str(exc)[:200])
        finally:
            self.in_flight -= 1
            self.done += 1


async def _drive(traffic: Traffic, total: int, concurrency: int) -> None:
    queue = iter(range(total))

    async def worker() -> None:
        for i in queue:
            await traffic.one(i)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def _first_check(timeout_s: float) -> dict[str, Any]:
    """The router cluster's health-check timeout. A changed cluster is rebuilt and its
    hosts serve only after a first passing check (envoyproxy/envoy#13070); on a busy host
    a 1 s check of the new cluster timed out and left it without healthy hosts."""
    return {"clusters": {"router": {"health_check": {"timeout_s": timeout_s}}}}


def _read_back(admin: str) -> dict[str, Any]:
    values = mesh_view.live_values(admin)
    routes = values["routes"]["edge_http"]
    return {
        "router_cluster": values["clusters"]["router"],
        "CompleteStream_route": routes["CompleteStream"],
        "CountTokens_route": routes["CountTokens"],
    }


async def _apply_when(
    traffic: Traffic, after: int, workdir: Path, policy: Path, admin: str, change: str
) -> dict[str, Any]:
    while traffic.done < after:  # noqa: ASYNC110 (polls a counter the workers bump)
        await asyncio.sleep(0.05)
    in_flight = traffic.in_flight
    done = await asyncio.to_thread(apply.apply, workdir, policy)
    return {
        "change": change,
        "after_requests": traffic.done,
        "in_flight_at_swap": in_flight,
        "replaced_clusters": list(done.replaced_clusters),
        "version": done.version,
        "previous": done.previous,
        "validate_s": round(done.validate_s, 3),
        "apply_s": round(done.apply_s, 4),
        "read_back": _read_back(admin),
    }


async def _watch_health(admin: str, lowest: dict[str, int], stop: asyncio.Event) -> None:
    """The fewest healthy hosts each cluster had while the traffic ran (0: requests to it
    fail with `no healthy upstream`)."""
    while not stop.is_set():
        found = await asyncio.to_thread(
            live.stats, admin, r"^cluster\.[a-z_]+\.membership_healthy$"
        )
        for name, value in found.items():
            cluster = name.split(".")[1]
            lowest[cluster] = min(lowest.get(cluster, int(value)), int(value))
        await asyncio.sleep(0.2)


def _edge_counters(admin: str) -> dict[str, int]:
    found = live.stats(admin, r"^(http\.edge_http\.downstream_cx_total|server\.uptime)$")
    return {k: int(v) for k, v in found.items()}


async def measure(
    stack: Stack, key: str, args: argparse.Namespace, run_dir: Path
) -> dict[str, Any]:
    endpoints = stack.config.ports.envoy
    admin = f"127.0.0.1:{endpoints.admin}"
    workdir = run_dir / "envoy"
    base = yaml.safe_load(POLICY.read_text(encoding="utf-8"))
    policies = []
    breaker = _merge(BREAKER, _first_check(args.hc_timeout_s))
    for name, change in (("breaker", breaker), ("retries", _merge(breaker, RETRIES))):
        path = run_dir / f"policy-{name}.yaml"
        path.write_text(yaml.safe_dump(_merge(base, change)), encoding="utf-8")
        policies.append(path)
    envoy_pid = next(p.pid for p in stack.processes() if p.spec.name == "envoy")
    before = _edge_counters(admin)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{endpoints.edge_http}")
    traffic = Traffic(channel, key)
    started = time.monotonic()
    drive = asyncio.create_task(_drive(traffic, args.requests, args.concurrency))
    lowest: dict[str, int] = {}
    stop = asyncio.Event()
    watch = asyncio.create_task(_watch_health(admin, lowest, stop))
    first = await _apply_when(
        traffic, args.apply_after, workdir, policies[0], admin, BREAKER_CHANGE
    )
    second = await _apply_when(
        traffic, 2 * args.apply_after, workdir, policies[1], admin, RETRIES_CHANGE
    )
    await drive
    elapsed = time.monotonic() - started
    stop.set()
    await watch
    await channel.close()
    after = _edge_counters(admin)
    envoy_now = next(p.pid for p in stack.processes() if p.spec.name == "envoy")
    return {
        "requests": traffic.done,
        "failed": traffic.failed,
        "errors": traffic.errors[:5],
        "policy_applied": True,
        "apply_s": [first["apply_s"], second["apply_s"]],
        "applies": [first, second],
        "router_health_check_timeout_s": args.hc_timeout_s,
        "concurrency": args.concurrency,
        "max_tokens": MAX_TOKENS,
        "elapsed_s": round(elapsed, 2),
        "client_reconnects": after["http.edge_http.downstream_cx_total"]
        - before["http.edge_http.downstream_cx_total"]
        - 1,  # the benchmark's one channel
        "fewest_healthy_hosts": lowest,
        "envoy_restarted": envoy_now != envoy_pid
        or after["server.uptime"] < before["server.uptime"],
        "goal": f">= {GOAL_REQUESTS} streams, 0 failed, no restart",
        "baseline": "before the policy: a change meant editing Python and restarting Envoy",
    }


def stack_config(run_dir: Path) -> StackConfig:
    config = StackConfig.from_env(ROOT, {**os.environ, "LLM_RUN_DIR": str(run_dir)})
    replicas = catalogue.local_replicas(config.models_config)
    return dataclasses.replace(
        config.with_ports(free_ports(tuple(r.port for r in replicas))),
        redis_prefix=f"bench{os.getpid()}:",
        log_level="WARNING",
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=240)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--apply-after", type=int, default=60)
    parser.add_argument(
        "--hc-timeout-s", type=float, default=5.0, help="router health-check timeout (policy)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "mesh_reload.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-mesh-") as run_dir:
        stack = Stack(stack_config(Path(run_dir)))
        try:
            _, key = start_with_key(stack, tenant="demo", name="bench-mesh")
            result = asyncio.run(measure(stack, key, args, Path(run_dir)))
        finally:
            stack.stop()
    result["ok"] = result["failed"] == 0 and result["requests"] >= GOAL_REQUESTS
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps({k: result[k] for k in ("requests", "failed", "apply_s", "ok")}))


if __name__ == "__main__":
    main()
