"""Router metrics, phase spans and the per-request access log (never any prompt text)."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Iterator
from typing import Any

from opentelemetry import trace
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from llm_common.logging import get_logger
from llm_common.tracing import unsampled_parent

TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
PHASE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0)

_access_log = get_logger("llm_router.access")
_access_level = logging.getLogger("llm_router.access")
_tracer = trace.get_tracer("llm_router")


class RouterMetrics:
    """`llm_router_*` metrics, bound to one registry so tests can use a fresh one."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else REGISTRY
        self.ttft = Histogram(
            "llm_router_ttft_seconds",
            "Time from request arrival to the first generated token leaving the router.",
            ["model"],
            buckets=TTFT_BUCKETS,
            registry=registry,
        )
        self.tpot = Histogram(
            "llm_router_time_per_output_token_seconds",
            "Mean time between generated tokens of a request, after the first.",
            ["model"],
            buckets=TPOT_BUCKETS,
            registry=registry,
        )
        self.tokens = Counter(
            "llm_router_tokens",
            "Tokens processed, by model and kind (prompt, completion, cached).",
            ["model", "kind"],
            registry=registry,
        )
        self.routed = Counter(
            "llm_router_routing_decisions",
            "Replica choices, by model, replica and reason (affinity, load, imbalance, ...).",
            ["model", "replica", "reason"],
            registry=registry,
        )
        self.failovers = Counter(
            "llm_router_failovers",
            "Requests re-dispatched to another replica before their first token.",
            ["model", "replica", "code"],
            registry=registry,
        )
        self.migrations = Counter(
            "llm_router_migrations",
            "Streams moved to another replica after output began, by outcome.",
            ["model", "outcome"],
            registry=registry,
        )
        self.cache = Counter(
            "llm_router_cache_lookups",
            "Response cache lookups by result (exact, semantic, miss, bypass, error).",
            ["result"],
            registry=registry,
        )
        self.near_cache = Counter(
            "llm_router_near_cache",
            "Near cache events: hit, stored, not_stored, invalidated (copies dropped by the "
            "change feed), feed_lost, report_failed, report_dropped.",
            ["event"],
            registry=registry,
        )
        self.phase = Histogram(
            "llm_router_phase_seconds",
            "Time spent in each phase of a request.",
            ["phase"],
            buckets=PHASE_BUCKETS,
            registry=registry,
        )
        self.guard = Counter(
            "llm_router_guard_actions",
            "Safety guard actions by direction (input, output) and action.",
            ["direction", "action"],
            registry=registry,
        )
        self.degraded = Counter(
            "llm_router_degraded",
            "Requests served with a dependency down, by dependency and what was done.",
            ["dependency", "action"],
            registry=registry,
        )
        self.quota_skipped = Counter(
            "llm_router_quota_skipped",
            "Token-quota reservations skipped: the key was recently reported unlimited.",
            registry=registry,
        )
        self.budget_skipped = Counter(
            "llm_router_budget_skipped",
            "Budget reservations skipped: billing recently said no budget applies to the "
            "tenant, key and model (settled without a reservation).",
            registry=registry,
        )
        self.settlements = Counter(
            "llm_router_settlements",
            "Usage settlements by outcome (settled, released, spooled, failed).",
            ["outcome"],
            registry=registry,
        )
        self.abandoned = Counter(
            "llm_router_abandoned_generations",
            "Generations started alongside admission or a slow cache lookup and then cancelled,"
            " by reason (refused, cache_hit, failed, cancelled, unconfirmed).",
            ["reason"],
            registry=registry,
        )
        self.token_memo = Counter(
            "llm_router_token_memo_lookups",
            "Prompt tokenizations answered from the router's memo (hit) or the tokenizer (miss).",
            ["result"],
            registry=registry,
        )
        self.speculated = Counter(
            "llm_router_tokenize_speculations",
            "Prompts tokenized in-process ahead of the tokenizer service, by the service's"
            " verdict (confirmed; mismatch: work restarted on the service's ids).",
            ["outcome"],
            registry=registry,
        )
        self.quota_leases = Counter(
            "llm_router_quota_lease_events",
            "Token-quota leases at auth by event: acquired, refused (the key is near its limit),"
            " refunded, refund_failed; drawn counts the requests admitted from a lease.",
            ["event"],
            registry=registry,
        )
        self.tokenizer_attested = Gauge(
            "llm_router_tokenizer_attested",
            "1 while the tokenizer service's fingerprint of a model equals the router's own and"
            " was seen recently: its prompts are counted in-process, with no call.",
            ["model"],
            registry=registry,
        )
        self.tokenizer_audits = Counter(
            "llm_router_tokenizer_audits",
            "Attested prompts also sent to the tokenizer service, by outcome (equal; different:"
            " the model's attestation is revoked until restart).",
            ["outcome"],
            registry=registry,
        )
        self.finished = Counter(
            "llm_router_requests_finished",
            "Generation requests by model and finish reason.",
            ["model", "finish_reason"],
            registry=registry,
        )


@contextlib.contextmanager
def phase(metrics: RouterMetrics, name: str, **attributes: Any) -> Iterator[trace.Span]:
    """A span and a duration observation for one phase (tokenize, admission, ...).

    Only for code without `yield` inside: a current span must not outlive its task switch.
    """
    start = time.perf_counter()
    unsampled = unsampled_parent()
    try:
        if unsampled is not None:  # no span would be recorded: skip making one
            yield unsampled
            return
        with _tracer.start_as_current_span(f"router.{name}", attributes=attributes) as span:
            yield span
    finally:
        metrics.phase.labels(name).observe(time.perf_counter() - start)


def start_span(name: str, **attributes: Any) -> trace.Span:
    """A span that is not made current, for phases that stream (end it explicitly)."""
    unsampled = unsampled_parent()
    if unsampled is not None:
        return unsampled
    return _tracer.start_span(f"router.{name}", attributes=attributes)


def digest(value: str) -> str:
    """A short stable digest for identifiers that must not be logged in clear (`user`)."""
    return hashlib.blake2b(value.encode("utf-8"), digest_size=8).hexdigest() if value else ""


def access_log(**fields: Any) -> None:
    """One structured line per request: ids, model, replica, tokens, timings, outcome."""
    if _access_level.isEnabledFor(logging.INFO):  # cheaper than structlog dropping the line
        _access_log.info("request", **fields)
