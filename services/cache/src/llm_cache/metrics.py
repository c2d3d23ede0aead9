"""Prometheus metrics of the cache (no tenant labels: unbounded cardinality)."""

from __future__ import annotations

import functools

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge


class CacheMetrics:
    """`llm_cache_*` counters and gauges, bound to one registry so tests can use a fresh one."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        registry = registry if registry is not None else REGISTRY
        self.lookups = Counter(
            "llm_cache_lookups", "Lookups by result: exact, semantic or miss.", ["result"],
            registry=registry,
        )  # fmt: skip
        self.misses = Counter(
            "llm_cache_misses", "Misses by reason.", ["reason"], registry=registry
        )
        self.stores = Counter(
            "llm_cache_stores",
            "Store calls by outcome: stored, dropped (store unavailable) or refused.",
            ["outcome"],
            registry=registry,
        )
        self.evictions = Counter(
            "llm_cache_evictions", "Entries evicted to stay within the byte budget.",
            registry=registry,
        )  # fmt: skip
        self.guard_rejections = Counter(
            "llm_cache_guard_rejections",
            "Semantic candidates above the threshold refused by the guard, by check.",
            ["check"],
            registry=registry,
        )
        self.index_vectors = Gauge(
            "llm_cache_index_vectors", "Vectors in this replica's semantic index.",
            registry=registry,
        )  # fmt: skip
        self.index_full = Counter(
            "llm_cache_index_full",
            "Entries not indexed because the index reached CACHE_INDEX_MAX_VECTORS.",
            registry=registry,
        )
        self.sync_errors = Counter(
            "llm_cache_index_sync_errors",
            "Failures publishing to, following or rebuilding from the replicas' change log.",
            registry=registry,
        )
        self.changes_lost = Counter(
            "llm_cache_changes_lost",
            "Changes never published: the log was unreachable and the retry backlog full.",
            registry=registry,
        )
        self.near_hits = Counter(
            "llm_cache_near_hits",
            "Exact hits callers served from their own copies (RecordHits; also in lookups).",
            registry=registry,
        )
        self.feed_subscribers = Gauge(
            "llm_cache_feed_subscribers", "Open WatchChanges streams.", registry=registry
        )
        self.feed_ended = Counter(
            "llm_cache_feed_ended",
            "WatchChanges streams ended by the service: store_unavailable, fell_behind, shutdown.",
            ["reason"],
            registry=registry,
        )


@functools.cache
def default_cache_metrics() -> CacheMetrics:
    """The process-wide CacheMetrics on the global registry, created on first use."""
    return CacheMetrics()
