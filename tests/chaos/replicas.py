"""Inference replicas as the chaos scenarios see them: which serve generation, whether one
has served, and whether Envoy's health checks exclude one."""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc

from .conftest import ChaosStack
from .harness import chat, metric_sum

INFERENCE = "llmapi.inference.v1.InferenceService"
WORKERS = 4
SERVED_TIMEOUT_S = 90.0  # covers Envoy's 30 s outlier ejection and the router's load watch
PROBE_PAUSE_S = 0.3  # between bursts: a rejoining replica may take half a minute


def generations_served(stack: ChaosStack, replica: str) -> float:
    """Generate RPCs the replica finished OK since it (re)started; 0 when it is down."""
    return metric_sum(
        stack.metrics(replica),
        "llm_rpc_requests_total",
        service=INFERENCE,
        method="Generate",
        code="OK",
    )


def generation_replicas(stack: ChaosStack) -> list[str]:
    replicas = sorted(
        p.spec.name
        for p in stack.stack.processes()
        if p.spec.name.startswith("replica-") and p.spec.env.get("INFERENCE_MODEL") == "demo-llama"
    )
    assert len(replicas) >= 2, f"scenario needs two generation replicas, found {replicas}"
    return replicas


def until_served(
    stack: ChaosStack, channel: grpc.Channel, replica: str, already: float = 0.0
) -> int:
    """Concurrent bursts until `replica` has served more than `already`; every request must
    succeed.

    Sequential requests would all go to the same replica (equal load, no prefix to share),
    so bursts give the router in-flight load to spread. The number of requests sent."""
    deadline = time.monotonic() + SERVED_TIMEOUT_S
    sent = 0
    with ThreadPoolExecutor(WORKERS) as pool:
        while generations_served(stack, replica) <= already:
            assert time.monotonic() < deadline, f"{replica} served none of {sent} requests"
            texts = [f"probe {uuid.uuid4().hex}" for _ in range(WORKERS)]
            codes = list(pool.map(lambda t: chat(channel, stack.demo_key, t).code, texts))
            sent += len(codes)
            assert codes == ["OK"] * len(codes), codes
            time.sleep(PROBE_PAUSE_S)  # pacing, not synchronisation: the loop polls the metric
    return sent


def envoy_excludes(stack: ChaosStack, replica_port: int) -> bool:
    from llm_stack import probes

    bad = probes.unhealthy_hosts(stack.stack.endpoints.admin, {"inference"})
    return any(host.startswith(f"inference/127.0.0.1:{replica_port}=") for host in bad)
