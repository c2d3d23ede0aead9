"""The response cache as a request sees it: its key, the near cache, then the cache service;
every outcome feeds the hit rate and latency that decide when generation starts early."""

from __future__ import annotations

import time

from llm_common.errors import ServiceError
from llm_common.logging import get_logger
from llm_router.api.identity import Caller
from llm_router.cache.near import near_key
from llm_router.cache.near_feed import NearCacheParts
from llm_router.cache.speculation import Speculation
from llm_router.clients.cache import CacheClient
from llm_router.observability import RouterMetrics, phase
from llm_router.requests import GenerationRequest, Kind
from llmapi.cache.v1 import cache_service_pb2 as cache_pb
from llmapi.common.v1 import common_pb2

_log = get_logger(__name__)


class CacheLookup:
    """Lookups for the pipeline. The cache is optional: any failure is a miss."""

    def __init__(
        self,
        cache: CacheClient | None,
        metrics: RouterMetrics,
        near: NearCacheParts | None,
        speculate_below_hit_rate: float,
    ) -> None:
        self._cache = cache
        self._metrics = metrics
        self._near = near
        self.speculation = Speculation(speculate_below_hit_rate)

    def key(
        self,
        request: GenerationRequest,
        caller: Caller,
        model: str,
        prompt: list[int],
        sampling: common_pb2.SamplingParams,
    ) -> cache_pb.CacheKey | None:
        """The request's cache key; None when it is not to be looked up or stored."""
        if self._cache is None or request.cache.bypass:
            return None
        if not (request.deterministic or request.cache.store_nondeterministic):
            return None
        key = cache_pb.CacheKey(
            tenant_id=caller.tenant_id,
            model=model,
            prompt_token_ids=prompt,
            sampling=sampling,
        )
        if request.kind is Kind.CHAT:
            key.messages.extend(request.messages)
            key.tools.extend(request.tools)
        else:
            key.prompt = request.prompt
        return key

    async def lookup(
        self, request: GenerationRequest, key: cache_pb.CacheKey | None
    ) -> cache_pb.LookupResponse | None:
        if self._cache is None or key is None:
            self._metrics.cache.labels("bypass").inc()
            return None
        options = cache_pb.LookupOptions(
            semantic=request.cache.semantic,
            allow_nondeterministic=request.cache.store_nondeterministic,
        )
        if request.cache.similarity_threshold is not None:
            options.similarity_threshold = request.cache.similarity_threshold
        lookup = cache_pb.LookupRequest(key=key, options=options)
        if self._near is None:
            return await self._remote_lookup(lookup)
        near, reporter = self._near.cache, self._near.reporter
        near_id = near_key(lookup)
        kept = near.get(near_id)
        if kept is not None:
            reporter.record(key.tenant_id, kept.entry_id)
            self._metrics.near_cache.labels("hit").inc()
            self._count_lookup("exact")
            return kept
        since = near.begin()
        response = await self._remote_lookup(lookup)
        if response is not None and response.kind == cache_pb.HIT_KIND_EXACT:
            kept_now = near.put(near_id, response, since)
            self._metrics.near_cache.labels("stored" if kept_now else "not_stored").inc()
        return response

    async def _remote_lookup(
        self, lookup: cache_pb.LookupRequest
    ) -> cache_pb.LookupResponse | None:
        with phase(self._metrics, "cache_lookup"):
            started = time.perf_counter()
            try:
                response = await self._client().lookup(lookup)
                self.speculation.latency.observe(time.perf_counter() - started)
            except ServiceError as err:
                # The cache is optional: any failure is a miss.
                self._metrics.cache.labels("error").inc()
                _log.info("cache lookup failed", code=err.code.name)
                return None
        kind = _HIT_LABELS.get(response.kind, "miss")
        self._count_lookup(kind)
        return response if kind in ("exact", "semantic") else None

    def _count_lookup(self, kind: str) -> None:
        self._metrics.cache.labels(kind).inc()
        self.speculation.hits.observe(kind in ("exact", "semantic"))

    def _client(self) -> CacheClient:
        assert self._cache is not None
        return self._cache


_HIT_LABELS = {
    cache_pb.HIT_KIND_EXACT: "exact",
    cache_pb.HIT_KIND_SEMANTIC: "semantic",
    cache_pb.HIT_KIND_MISS: "miss",
}
