"""Billing metrics: reservation and settlement outcomes, money charged, expiries."""

from __future__ import annotations

import functools

from prometheus_client import REGISTRY, CollectorRegistry, Counter


class BillingMetrics:
    """`llm_billing_*` counters (no tenant labels: unbounded cardinality), on one registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else REGISTRY
        self.reservations = Counter(
            "llm_billing_reservations",
            "Reserve calls by outcome: held, duplicate, soft_limit, rejected.",
            ["outcome"],
            registry=registry,
        )
        self.settlements = Counter(
            "llm_billing_settlements",
            "Settle calls by outcome: settled, duplicate, corrected, unreserved.",
            ["outcome"],
            registry=registry,
        )
        self.releases = Counter(
            "llm_billing_releases",
            "Release calls by outcome: released, noop.",
            ["outcome"],
            registry=registry,
        )
        self.charged = Counter(
            "llm_billing_charged_micros",
            "Final cost of settled requests in micros, by currency (a Settle that corrects an"
            " expired charge counts its corrected amount).",
            ["currency"],
            registry=registry,
        )
        self.batch_items = Counter(
            "llm_billing_batch_items",
            "SettleBatch and ReserveBatch items by call (settle, release, reserve) and gRPC"
            " status code (the outcome of each is also counted in the settlements, releases"
            " or reservations counters, as the unary call's).",
            ["call", "code"],
            registry=registry,
        )
        self.expired = Counter(
            "llm_billing_expired_reservations",
            "Reservations charged at their reserved amount because they were not settled in time.",
            registry=registry,
        )


@functools.cache
def default_billing_metrics() -> BillingMetrics:
    """The process-wide BillingMetrics on the global registry, created on first use."""
    return BillingMetrics()
