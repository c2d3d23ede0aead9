"""Billing metrics: reservation and settlement outcomes, money charged, expiries."""

from __future__ import annotations

import functools

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge


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
        self.outbox_backlog = Gauge(
            "llm_billing_usage_outbox_backlog",
            "Usage outbox entries in Redis not yet written to the SQL usage store (set by the"
            " process that drains the outbox; others report 0: aggregate with max).",
            registry=registry,
        )
        self.outbox_oldest = Gauge(
            "llm_billing_usage_outbox_oldest_seconds",
            "Age of the oldest usage outbox entry not yet written to the store (0: none).",
            registry=registry,
        )
        self.store_rows = Counter(
            "llm_billing_usage_store_rows",
            "Usage rows written (upserted) to the SQL usage store.",
            registry=registry,
        )
        self.store_errors = Counter(
            "llm_billing_usage_store_errors",
            "Failed usage store operations by op (write, migrate); both are retried.",
            ["op"],
            registry=registry,
        )
        self.store_up = Gauge(
            "llm_billing_usage_store_up",
            "1 when the last usage store write succeeded, 0 while the database is unreachable.",
            registry=registry,
        )
        self.reconcile_differences = Gauge(
            "llm_billing_reconcile_differences",
            "Tenant x key x model x hour cells where the Redis ledger and the usage store"
            " differed in the last reconciliation.",
            registry=registry,
        )
        self.reconcile_runs = Counter(
            "llm_billing_reconcile_runs",
            "Reconciliation runs by result: clean, differences, failed.",
            ["result"],
            registry=registry,
        )
        for result in ("clean", "differences", "failed"):  # exported as 0 from the start
            self.reconcile_runs.labels(result)
        for op in ("write", "migrate"):
            self.store_errors.labels(op)


@functools.cache
def default_billing_metrics() -> BillingMetrics:
    """The process-wide BillingMetrics on the global registry, created on first use."""
    return BillingMetrics()
