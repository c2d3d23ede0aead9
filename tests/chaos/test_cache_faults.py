"""Scenario (e): the cache fails half its calls (LLM_FAULTS). Every request is still served,
the router's cache breaker opens, and once the fault is lifted (the cache restarted without
it) the breaker's half-open trial succeeds and it closes again."""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from .conftest import ChaosStack
from .harness import chat, metric_sum, record

pytestmark = pytest.mark.chaos

CACHE = "llmapi.cache.v1.CacheService"
# INTERNAL, not UNAVAILABLE: the mesh retries UNAVAILABLE twice, which would leave only one
# call in eight failing at the router, too few for five failures in a row.
FAULT = f"/{CACHE}/*:error_rate=0.5,code=INTERNAL"
BREAKER = "router-cache"
WORKERS = 3
OPEN_TIMEOUT_S = 90.0
CLOSE_TIMEOUT_S = 60.0  # the breaker's 10 s reset, a cache restart and the trial call
OPEN, CLOSED = 2.0, 0.0
BURST_PAUSE_S = 0.2  # the breaker's 10 s reset needs no more load than this


def _breaker_state(stack: ChaosStack) -> float:
    return metric_sum(stack.metrics("router"), "llm_breaker_state", breaker=BREAKER)


def _breaker_opened(stack: ChaosStack) -> float:
    return metric_sum(stack.metrics("router"), "llm_breaker_opened_total", breaker=BREAKER)


def _served_until(
    stack: ChaosStack, channel: grpc.Channel, what: str, done: Callable[[], bool], timeout_s: float
) -> Counter[str]:
    """Bursts of WORKERS chats until `done()`; the codes they ended with."""
    codes: Counter[str] = Counter()
    deadline = time.monotonic() + timeout_s
    with ThreadPoolExecutor(WORKERS) as pool:
        while not done():
            assert time.monotonic() < deadline, f"{what}: not within the deadline; {dict(codes)}"
            texts = [f"cache fault {uuid.uuid4().hex}" for _ in range(WORKERS)]
            codes.update(pool.map(lambda t: chat(channel, stack.demo_key, t).code, texts))
            time.sleep(BURST_PAUSE_S)  # pacing, not synchronisation: `done` is polled
    return codes


def _transitions(log: str, since: int) -> list[str]:
    """The router's breaker state changes logged for the cache after byte `since`."""
    states = []
    for line in log[since:].splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("breaker") == BREAKER:
            states.append(str(entry.get("state", "open")))
    return states


def _recovers_through_half_open(
    chaos_stack: ChaosStack, router_log: Path, log_start: int
) -> tuple[Counter[str], float, list[str]]:
    """Requests until the breaker is closed again (all served), how long that took, and the
    breaker's transitions: closed again only through a successful half-open trial."""
    since = time.monotonic()
    with grpc.insecure_channel(chaos_stack.edge) as channel:
        recovered = _served_until(
            chaos_stack,
            channel,
            "breaker closed",
            lambda: _breaker_state(chaos_stack) == CLOSED,
            CLOSE_TIMEOUT_S,
        )
    closed_s = time.monotonic() - since
    assert set(recovered) == {"OK"}, dict(recovered)
    transitions = _transitions(router_log.read_text(errors="replace"), log_start)
    assert "half_open" in transitions, transitions
    assert transitions[-1] == "closed", transitions
    return recovered, closed_s, transitions


def test_failing_cache_opens_the_breaker_and_recovers(chaos_stack: ChaosStack) -> None:
    router_log = chaos_stack.process("router").spec.log
    log_start = router_log.stat().st_size
    opened_before = _breaker_opened(chaos_stack)
    assert _breaker_state(chaos_stack) == CLOSED
    started = time.monotonic()
    chaos_stack.restart("cache", {"LLM_FAULTS": FAULT})
    try:
        with grpc.insecure_channel(chaos_stack.edge) as channel:
            faulty = _served_until(
                chaos_stack,
                channel,
                "breaker open",
                lambda: _breaker_opened(chaos_stack) > opened_before,
                OPEN_TIMEOUT_S,
            )
            opened_s = time.monotonic() - started
            assert set(faulty) == {"OK"}, dict(faulty)  # the cache is optional
            # While open, lookups are not even tried and requests are still served.
            assert _breaker_state(chaos_stack) == OPEN
            while_open = chat(channel, chaos_stack.demo_key, f"open {uuid.uuid4().hex}").code
            assert while_open == "OK"
    finally:
        restart_at = time.monotonic()
        chaos_stack.restart("cache", {"LLM_FAULTS": None})
    lifted = time.monotonic()
    recovered, closed_s, transitions = _recovers_through_half_open(
        chaos_stack, router_log, log_start
    )
    record(
        "cache_faults",
        {
            "fault": FAULT,
            "requests_while_faulty": sum(faulty.values()),
            "codes_while_faulty": dict(faulty) | {"while_open": while_open},
            "breaker_opened_after_s": round(opened_s, 2),
            "requests_until_closed": sum(recovered.values()),
            "cache_restart_without_fault_s": round(lifted - restart_at, 2),
            "closed_after_cache_restart_s": round(closed_s, 2),
            "breaker_transitions": transitions,
        },
    )


def test_frozen_cache_is_bypassed_and_recovers_when_thawed(chaos_stack: ChaosStack) -> None:
    """The SIGSTOP variant: a hung cache (sockets open, nothing answered) costs timeouts, not
    failed requests; the breaker opens, and closes again through half-open once thawed."""
    cache = chaos_stack.process("cache")
    router_log = chaos_stack.process("router").spec.log
    log_start = router_log.stat().st_size
    opened_before = _breaker_opened(chaos_stack)
    assert _breaker_state(chaos_stack) == CLOSED
    started = time.monotonic()
    cache.freeze()
    try:
        with grpc.insecure_channel(chaos_stack.edge) as channel:
            frozen = _served_until(
                chaos_stack,
                channel,
                "breaker open",
                lambda: _breaker_opened(chaos_stack) > opened_before,
                OPEN_TIMEOUT_S,
            )
        opened_s = time.monotonic() - started
        assert set(frozen) == {"OK"}, dict(frozen)
    finally:
        cache.thaw()
    thawed = time.monotonic()
    chaos_stack.wait_envoy_healthy("cache")
    recovered, _, transitions = _recovers_through_half_open(chaos_stack, router_log, log_start)
    closed_s = time.monotonic() - thawed  # from the thaw, Envoy's health check included
    assert cache.alive()
    record(
        "cache_frozen",
        {
            "fault": "SIGSTOP on the cache process, SIGCONT after the breaker opened",
            "requests_while_frozen": sum(frozen.values()),
            "codes_while_frozen": dict(frozen),
            "breaker_opened_after_s": round(opened_s, 2),
            "requests_until_closed": sum(recovered.values()),
            "closed_after_thaw_s": round(closed_s, 2),
            "breaker_transitions": transitions,
        },
    )
