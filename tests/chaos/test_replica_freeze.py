"""The SIGSTOP variant of scenario (a): an inference replica cut off while it keeps its sockets
open (frozen, answering nothing). Envoy's health checks exclude it, the router stops sending it
work once its load reports go stale, no request ends worse than DEADLINE_EXCEEDED meanwhile,
and once thawed it takes traffic again."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from .conftest import ChaosStack
from .harness import chat, record, until
from .replicas import (
    WORKERS,
    envoy_excludes,
    generation_replicas,
    generations_served,
    until_served,
)

pytestmark = pytest.mark.chaos

REQUEST_DEADLINE_S = 10.0
STEER_TIMEOUT_S = 60.0  # the router's 5 s load staleness, plus hung requests' deadlines
CLEAN_BURSTS = 2  # bursts in a row that must all succeed once the router steers clear
TRANSITION_CODES = {"OK", "DEADLINE_EXCEEDED"}  # a hung request runs into its deadline


def _burst(stack: ChaosStack, channel: grpc.Channel) -> list[str]:
    texts = [f"frozen replica {uuid.uuid4().hex}" for _ in range(WORKERS)]
    with ThreadPoolExecutor(WORKERS) as pool:
        return list(
            pool.map(
                lambda t: chat(channel, stack.demo_key, t, timeout_s=REQUEST_DEADLINE_S).code,
                texts,
            )
        )


def test_frozen_replica_is_avoided_and_rejoins_when_thawed(chaos_stack: ChaosStack) -> None:
    victim = generation_replicas(chaos_stack)[1]
    process = chaos_stack.process(victim)
    with grpc.insecure_channel(chaos_stack.edge) as channel:
        until_served(chaos_stack, channel, victim)  # it takes traffic before
        process.freeze()
        frozen_at = time.monotonic()
        try:
            excluded_s = until(
                "envoy excludes the frozen replica",
                lambda: envoy_excludes(chaos_stack, process.spec.grpc_port),
                15,
            )
            codes: Counter[str] = Counter()
            clean = 0
            deadline = time.monotonic() + STEER_TIMEOUT_S
            while clean < CLEAN_BURSTS:
                assert time.monotonic() < deadline, f"still failing requests: {dict(codes)}"
                burst = _burst(chaos_stack, channel)
                codes.update(burst)
                clean = clean + 1 if set(burst) == {"OK"} else 0
            assert set(codes) <= TRANSITION_CODES, dict(codes)
            steered_s = time.monotonic() - frozen_at
        finally:
            process.thaw()
        thawed_at = time.monotonic()
        chaos_stack.wait_envoy_healthy("inference", 60)
        served = generations_served(chaos_stack, victim)  # the same process: counts go on
        rejoin_requests = until_served(chaos_stack, channel, victim, served)
        rejoin_s = time.monotonic() - thawed_at
    assert process.alive()
    record(
        "replica_frozen",
        {
            "fault": "SIGSTOP on one generation replica, SIGCONT after traffic avoided it",
            "requests_while_frozen": sum(codes.values()),
            "codes_while_frozen": dict(codes),
            "envoy_excluded_after_s": round(excluded_s, 2),
            "clean_after_s": round(steered_s, 2),
            "rejoin_after_thaw_s": round(rejoin_s, 2),
            "rejoin_probe_requests": rejoin_requests,
        },
    )
