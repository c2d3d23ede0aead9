"""Scenario (a): an inference replica killed with SIGKILL under load, then restarted."""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from .conftest import ChaosStack
from .harness import chat, metric_sum

pytestmark = pytest.mark.chaos

INFERENCE = "llmapi.inference.v1.InferenceService"
WORKERS = 3
PER_WORKER = 6
MAX_PROBE_REQUESTS = 40
# Envoy ejects a failing replica for 30 s (outlier base_ejection_time); it may only return then.
REJOIN_TIMEOUT_S = 75.0
PROBE_PAUSE_S = 0.5


def _generations_served(stack: ChaosStack, replica: str) -> float:
    """Generate RPCs the replica finished OK since it (re)started; 0 when it is down."""
    return metric_sum(
        stack.metrics(replica),
        "llm_rpc_requests_total",
        service=INFERENCE,
        method="Generate",
        code="OK",
    )


def _chat(stack: ChaosStack, channel: grpc.Channel, text: str) -> str:
    return chat(channel, stack.demo_key, text).code


def _generation_replicas(stack: ChaosStack) -> list[str]:
    replicas = sorted(
        p.spec.name
        for p in stack.stack.processes()
        if p.spec.name.startswith("replica-") and p.spec.env.get("INFERENCE_MODEL") == "demo-llama"
    )
    assert len(replicas) >= 2, f"scenario needs two generation replicas, found {replicas}"
    return replicas


def _until_served(
    stack: ChaosStack, channel: grpc.Channel, replica: str, timeout_s: float = 0.0
) -> None:
    """Requests sent until `replica` has served one: at least MAX_PROBE_REQUESTS tries, for at
    least `timeout_s`; each must succeed."""
    deadline = time.monotonic() + timeout_s
    sent = 0
    while sent < MAX_PROBE_REQUESTS or time.monotonic() < deadline:
        sent += 1
        assert _chat(stack, channel, f"probe {sent}") == "OK"
        if _generations_served(stack, replica) > 0:
            return
        if timeout_s:
            time.sleep(PROBE_PAUSE_S)
    pytest.fail(f"{replica} served none of {sent} requests")


def _envoy_excludes(stack: ChaosStack, replica_port: int) -> bool:
    from llm_stack import probes

    bad = probes.unhealthy_hosts(stack.stack.endpoints.admin, {"inference"})
    return any(host.startswith(f"inference/127.0.0.1:{replica_port}=") for host in bad)


def test_killed_replica_is_excluded_and_rejoins_after_restart(chaos_stack: ChaosStack) -> None:
    from llm_stack import probes

    survivor, victim = _generation_replicas(chaos_stack)[:2]
    process = chaos_stack.process(victim)
    with grpc.insecure_channel(chaos_stack.edge) as channel:
        _until_served(chaos_stack, channel, victim)  # both replicas take traffic before
        killed = threading.Event()
        before_kill: Counter[str] = Counter()
        after_kill: Counter[str] = Counter()

        def worker(index: int) -> None:
            for n in range(PER_WORKER):
                already_killed = killed.is_set()
                code = _chat(chaos_stack, channel, f"load {index}-{n}")
                (after_kill if already_killed else before_kill)[code] += 1

        with ThreadPoolExecutor(WORKERS) as pool:
            futures = [pool.submit(worker, i) for i in range(WORKERS)]
            time.sleep(0.5)  # load is running
            process.kill()  # SIGKILL: no drain, no goodbye
            killed.set()
            for future in futures:
                future.result()
        survivor_served = _generations_served(chaos_stack, survivor)

        # Sent after the kill: none had started streaming, so every one completes elsewhere.
        assert after_kill["OK"] == sum(after_kill.values()) > 0, dict(after_kill)
        # In flight at the kill: they complete, or end UNAVAILABLE; never INTERNAL/UNKNOWN.
        assert set(before_kill) <= {"OK", "UNAVAILABLE"}, dict(before_kill)
        assert survivor_served > 0
        assert _generations_served(chaos_stack, victim) == 0
        probes.wait_until(
            "envoy excludes the killed replica",
            lambda: _envoy_excludes(chaos_stack, process.spec.grpc_port),
            15,
            lambda: None,
        )

        process.start()
        target = f"127.0.0.1:{process.spec.grpc_port}"
        probes.wait_until(
            victim,
            lambda: probes.grpc_serving(target, process.spec.health_service),
            120,
            lambda: None if process.alive() else "exited",
        )
        # The restarted replica takes traffic again once Envoy lets it back in.
        _until_served(chaos_stack, channel, victim, REJOIN_TIMEOUT_S)
        assert not _envoy_excludes(chaos_stack, process.spec.grpc_port)
