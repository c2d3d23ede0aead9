"""Scenario (d): a slow tokenizer (LLM_FAULTS delay). Client deadlines are honoured end to end
(the caller gets DEADLINE_EXCEEDED on time and the tokenizer's call is cut off too, with no
retry), and calls that outlive Envoy's per-try timeout are retried within the retry budget.

The router runs with attestation off here, so it asks the tokenizer for every prompt, as it
does whenever the tokenizer's files differ from its own: with them attested it makes no
per-request call that a slow tokenizer could hold up."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from .conftest import ChaosStack
from .harness import Outcome, chat, envoy_stats, metric_sum, record, until

pytestmark = pytest.mark.chaos

TOKENIZER = "llmapi.tokenizer.v1.TokenizerService"
# Longer than the mesh's per-try timeout for the tokenizer (10 s / 3), shorter than the
# router's own 5 s call timeout: a try is cut at 3.3 s and retried once, never completed.
DELAY_MS = 4000
FAULT = f"/{TOKENIZER}/ApplyChatTemplate:delay_ms={DELAY_MS}"
CLIENT_DEADLINE_S = 1.5
DEADLINE_SLACK_S = 1.0
SERVER_SLACK_S = 3.0  # until the tokenizer has counted the cancelled calls (busy host)
WORKERS = 8
# The mesh's retry policy and the tokenizer cluster's retry budget (infra/envoy).
NUM_RETRIES = 2
BUDGET_MIN_CONCURRENCY = 5
BUDGET_PERCENT = 20.0
ALLOWED_CODES = {"DEADLINE_EXCEEDED", "UNAVAILABLE"}
UNATTESTED = "ROUTER_TOKENIZER_ATTEST_INTERVAL_S"  # "0": every prompt goes to the tokenizer


def _burst(stack: ChaosStack, channel: grpc.Channel, deadline_s: float) -> list[Outcome]:
    """WORKERS chats released together, so their tokenizer calls (and retries) overlap."""
    gate = threading.Barrier(WORKERS)

    def one(index: int) -> Outcome:
        gate.wait()
        text = f"slow tokenizer {index} {uuid.uuid4().hex}"
        return chat(channel, stack.demo_key, text, timeout_s=deadline_s)

    with ThreadPoolExecutor(WORKERS) as pool:
        return list(pool.map(one, range(WORKERS)))


def _tokenizer_calls_ended(stack: ChaosStack) -> float:
    """ApplyChatTemplate calls the tokenizer finished, whatever their status."""
    return metric_sum(
        stack.metrics("tokenizer"),
        "llm_rpc_requests_total",
        service=TOKENIZER,
        method="ApplyChatTemplate",
    )


def _retry_stats(stack: ChaosStack) -> dict[str, int]:
    stats = envoy_stats(stack.stack.endpoints.admin, "cluster.tokenizer.")
    names = ("upstream_rq_retry", "upstream_rq_retry_overflow", "upstream_rq_total",
             "upstream_rq_per_try_timeout", "upstream_rq_retry_limit_exceeded")  # fmt: skip
    return {name: stats.get(f"cluster.tokenizer.{name}", 0) for name in names}


def _delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {name: after[name] - before[name] for name in after}


def test_slow_tokenizer_honours_deadlines_without_a_retry_storm(chaos_stack: ChaosStack) -> None:
    started = time.monotonic()
    chaos_stack.restart("router", {UNATTESTED: "0"})
    chaos_stack.restart("tokenizer", {"LLM_FAULTS": FAULT})
    try:
        with grpc.insecure_channel(chaos_stack.edge) as channel:
            deadline_figures = _deadline_phase(chaos_stack, channel)
            budget_figures = _budget_phase(chaos_stack, channel)
    finally:
        chaos_stack.restart("tokenizer", {"LLM_FAULTS": None})
        chaos_stack.restart("router", {UNATTESTED: None})
    with grpc.insecure_channel(chaos_stack.edge) as channel:
        assert chat(channel, chaos_stack.demo_key, "tokenizer fast again").code == "OK"
    record(
        "slow_tokenizer",
        {
            "fault": FAULT,
            "deadline": deadline_figures,
            "retry_budget": budget_figures,
            "duration_s": round(time.monotonic() - started, 1),
        },
    )


def _deadline_phase(stack: ChaosStack, channel: grpc.Channel) -> dict[str, object]:
    """A client deadline shorter than the delay: DEADLINE_EXCEEDED on time, the tokenizer's
    call cancelled with it (the deadline travelled), and no retry of it by the mesh."""
    ended_before = _tokenizer_calls_ended(stack)
    stats_before = _retry_stats(stack)
    outcomes = _burst(stack, channel, CLIENT_DEADLINE_S)
    codes = Counter(o.code for o in outcomes)
    assert codes == {"DEADLINE_EXCEEDED": WORKERS}, dict(codes)
    slowest = max(o.seconds for o in outcomes)
    assert slowest <= CLIENT_DEADLINE_S + DEADLINE_SLACK_S, slowest
    # The tokenizer stops each call long before its 4 s delay would have run out.
    server_s = until(
        "the tokenizer ends the calls whose deadline passed",
        lambda: _tokenizer_calls_ended(stack) - ended_before >= WORKERS,
        SERVER_SLACK_S,
    )
    retries = _delta(_retry_stats(stack), stats_before)
    assert retries["upstream_rq_retry"] == 0, retries  # nothing retried past the deadline
    assert retries["upstream_rq_per_try_timeout"] == 0, retries
    return {
        "requests": WORKERS,
        "client_deadline_s": CLIENT_DEADLINE_S,
        "codes": dict(codes),
        "slowest_client_s": round(slowest, 3),
        "tokenizer_calls_ended_after_s": round(slowest + server_s, 3),
        "envoy": retries,
    }


def _budget_phase(stack: ChaosStack, channel: grpc.Channel) -> dict[str, object]:
    """No client deadline: each tokenizer try outlives the per-try timeout. Envoy retries
    at most NUM_RETRIES times per call, and no more at once than the retry budget allows."""
    before = _retry_stats(stack)
    outcomes = _burst(stack, channel, 60.0)
    codes = Counter(o.code for o in outcomes)
    assert set(codes) <= ALLOWED_CODES, dict(codes)  # a clear status, never INTERNAL/UNKNOWN
    stats = _delta(_retry_stats(stack), before)
    calls = stats["upstream_rq_total"] - stats["upstream_rq_retry"]
    assert calls >= WORKERS, stats  # every request reached the tokenizer
    assert stats["upstream_rq_per_try_timeout"] >= WORKERS, stats  # the premise: tries time out
    assert stats["upstream_rq_retry"] <= NUM_RETRIES * calls, stats
    # The retries overlap (each lives until the router's 5 s call timeout), so their total is
    # bounded by the budget's concurrency: max(min_retry_concurrency, 20 % of active calls).
    budget = max(BUDGET_MIN_CONCURRENCY, int(BUDGET_PERCENT / 100 * (calls + WORKERS)))
    assert stats["upstream_rq_retry"] <= budget, stats
    return {
        "requests": WORKERS,
        "codes": dict(codes),
        "slowest_client_s": round(max(o.seconds for o in outcomes), 3),
        "retry_budget_concurrency": budget,
        "envoy": stats,
    }
