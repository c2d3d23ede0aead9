"""Prometheus metrics of the auth service: authentications, cache fallbacks, limit decisions."""

from __future__ import annotations

import functools

from prometheus_client import REGISTRY, CollectorRegistry, Counter


class AuthMetrics:
    """`llm_auth_*` counters, bound to one registry so tests can use a fresh one."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else REGISTRY
        self.authentications = Counter(
            "llm_auth_authentications",
            "Credential checks, by credential type and outcome (ok or the denial reason).",
            ["credential_type", "outcome"],
            registry=registry,
        )
        self.cache_fallbacks = Counter(
            "llm_auth_key_cache_fallbacks",
            "Key lookups answered while Redis was unreachable: hit = served from the "
            "in-process cache, miss = failed with UNAVAILABLE.",
            ["outcome"],
            registry=registry,
        )
        self.limit_decisions = Counter(
            "llm_auth_rate_limit_decisions",
            "Rate-limit decisions by limit kind (requests, tokens, concurrency) and result.",
            ["kind", "result"],
            registry=registry,
        )
        self.limit_failures = Counter(
            "llm_auth_rate_limit_store_failures",
            "Rate-limit checks made without Redis, by kind and the configured failure mode.",
            ["kind", "mode"],
            registry=registry,
        )
        self.ext_authz = Counter(
            "llm_auth_ext_authz_checks",
            "Envoy ext_authz answers, by HTTP status (200 allowed, 401, 403, 503).",
            ["status"],
            registry=registry,
        )
        self.auth_throttles = Counter(
            "llm_auth_failed_auth_throttled",
            "Checks answered 429 after too many failed authentications, by scope: address "
            "(refused before the credential is checked) or key (a key id's failed attempts).",
            ["scope"],
            registry=registry,
        )
        # Label values are few (credential types x outcomes, HTTP statuses).
        self._children: dict[tuple[str, str], Counter] = {}
        self._ext_authz_children: dict[int, Counter] = {}

    def authenticated(self, credential_type: str, outcome: str) -> None:
        # Children are looked up once per label set: labels() costs more than inc() on the
        # ext_authz hot path.
        child = self._children.get((credential_type, outcome))
        if child is None:
            child = self._children[(credential_type, outcome)] = self.authentications.labels(
                credential_type, outcome
            )
        child.inc()

    def cache_fallback(self, hit: bool) -> None:
        self.cache_fallbacks.labels("hit" if hit else "miss").inc()

    def limit_decision(self, kind: str, allowed: bool) -> None:
        self.limit_decisions.labels(kind, "ok" if allowed else "over_limit").inc()

    def limit_failure(self, kind: str, mode: str) -> None:
        self.limit_failures.labels(kind, mode).inc()

    def auth_throttled(self, scope: str) -> None:
        self.auth_throttles.labels(scope).inc()

    def ext_authz_answer(self, status: int) -> None:
        child = self._ext_authz_children.get(status)
        if child is None:
            child = self._ext_authz_children[status] = self.ext_authz.labels(str(status))
        child.inc()


@functools.cache
def default_auth_metrics() -> AuthMetrics:
    """The process-wide AuthMetrics on the global registry, created on first use."""
    return AuthMetrics()
