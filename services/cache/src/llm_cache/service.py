"""CacheServicer: validate, translate protobuf <-> domain, call ResponseCache."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from llm_cache import validation
from llm_cache.cache import (
    Kind,
    LookupOptions,
    LookupResult,
    NearHits,
    ResponseCache,
    StatsView,
    StoreOptions,
)
from llm_cache.canonical import request_key
from llm_cache.config import Limits, Policy
from llm_cache.feed import HEARTBEAT_INTERVAL_MS, ChangeFeed
from llm_common.audit import AuditLog, audited
from llm_common.validation import Violations
from llmapi.cache.v1 import cache_service_pb2 as pb
from llmapi.cache.v1 import cache_service_pb2_grpc as pb_grpc
from llmapi.common.v1 import common_pb2

Context = grpc.aio.ServicerContext[Any, Any]
_KINDS = {
    Kind.EXACT: pb.HIT_KIND_EXACT,
    Kind.SEMANTIC: pb.HIT_KIND_SEMANTIC,
    Kind.MISS: pb.HIT_KIND_MISS,
}
# Only responses that ran to their natural end are worth replaying.
_COMPLETE = frozenset({common_pb2.FINISH_REASON_STOP, common_pb2.FINISH_REASON_LENGTH})


class CacheServicer(pb_grpc.CacheServiceServicer):
    """llmapi.cache.v1.CacheService over a ResponseCache."""

    def __init__(
        self,
        cache: ResponseCache,
        feed: ChangeFeed,
        limits: Limits,
        policy: Policy,
        *,
        audit: AuditLog | None = None,
    ) -> None:
        self._audit = audit or AuditLog()
        self._cache = cache
        self._feed = feed
        self._limits = limits
        self._policy = policy

    # Method names are the contract's RPC names, hence the noqa N802.
    async def Lookup(self, request: pb.LookupRequest, context: Context) -> pb.LookupResponse:  # noqa: N802
        v = Violations()
        validation.check_key(v, "key", request.key, self._limits)
        validation.check_options(v, "options", request.options)
        v.raise_if_any()
        options = request.options
        result = await self._cache.lookup(
            request_key(request.key),
            LookupOptions(
                semantic=options.semantic,
                threshold=(
                    options.similarity_threshold
                    if options.HasField("similarity_threshold")
                    else None
                ),
                allow_nondeterministic=options.allow_nondeterministic,
            ),
        )
        return _lookup_response(result)

    async def Store(self, request: pb.StoreRequest, context: Context) -> pb.StoreResponse:  # noqa: N802
        v = Violations()
        validation.check_key(v, "key", request.key, self._limits)
        v.require(request.HasField("response"), "response", "is required")
        validation.check_response(v, "response", request.response)
        validation.check_ttl(v, "ttl_seconds", request.ttl_seconds, self._policy)
        v.raise_if_any()
        stored = pb.CachedResponse()
        stored.CopyFrom(request.response)
        stored.ClearField("created_at")  # the cache's own clock decides
        outcome = await self._cache.store(
            request_key(request.key),
            stored.SerializeToString(deterministic=True),
            StoreOptions(
                ttl_s=request.ttl_seconds,
                allow_nondeterministic=request.allow_nondeterministic,
                semantic_index=not request.no_semantic_index,
                complete=request.response.finish_reason in _COMPLETE,
            ),
        )
        return pb.StoreResponse(
            stored=outcome.stored,
            entry_id=outcome.entry_id,
            reason=outcome.reason,
            evicted=outcome.evicted,
        )

    async def Invalidate(  # noqa: N802
        self, request: pb.InvalidateRequest, context: Context
    ) -> pb.InvalidateResponse:
        v = Violations()
        validation.check_id(v, "tenant_id", request.tenant_id, self._limits, required=True)
        validation.check_entry_id(v, "entry_id", request.entry_id, required=False)
        validation.check_id(v, "model", request.model, self._limits, required=False)
        if request.entry_id and request.model:
            v.add("model", "must be empty when entry_id is set (set at most one)")
        v.raise_if_any()
        removed = await self._cache.invalidate(
            request.tenant_id, entry_id=request.entry_id, model=request.model
        )
        return pb.InvalidateResponse(removed=removed)

    async def ForgetTenant(  # noqa: N802
        self, request: pb.ForgetTenantRequest, context: Context
    ) -> pb.ForgetTenantResponse:
        """Admin only: the edge admits it for admins of the admin tenant (as Invalidate)."""
        v = Violations()
        validation.check_id(v, "tenant_id", request.tenant_id, self._limits, required=True)
        v.raise_if_any()
        with audited(self._audit, context, "tenant.forget", f"tenant:{request.tenant_id}"):
            gone = await self._cache.forget_tenant(request.tenant_id)
        return pb.ForgetTenantResponse(
            entries_removed=gone.entries, keys_destroyed=gone.keys_destroyed
        )

    async def Feedback(  # noqa: N802
        self, request: pb.FeedbackRequest, context: Context
    ) -> pb.FeedbackResponse:
        v = Violations()
        validation.check_id(v, "tenant_id", request.tenant_id, self._limits, required=True)
        validation.check_entry_id(v, "entry_id", request.entry_id, required=True)
        has_key = request.HasField("key")
        if has_key:
            validation.check_key(v, "key", request.key, self._limits)
            v.require(
                request.key.tenant_id == request.tenant_id,
                "key.tenant_id",
                "must equal tenant_id",
            )
        v.raise_if_any()
        outcome = await self._cache.feedback(
            request.tenant_id, request.entry_id, request_key(request.key) if has_key else None
        )
        return pb.FeedbackResponse(removed=outcome.removed, pair_blocked=outcome.pair_blocked)

    async def Stats(self, request: pb.StatsRequest, context: Context) -> pb.StatsResponse:  # noqa: N802
        v = Violations()
        validation.check_id(v, "tenant_id", request.tenant_id, self._limits, required=False)
        v.raise_if_any()
        view = await self._cache.stats(request.tenant_id or None)
        return _stats_response(view, self._policy.tenant_budget_bytes)

    async def WatchChanges(  # noqa: N802
        self, request: pb.WatchChangesRequest, context: Context
    ) -> AsyncIterator[pb.WatchChangesResponse]:
        with self._feed.subscribe() as subscription:
            async for entry_ids in subscription:
                yield pb.WatchChangesResponse(
                    entry_ids=entry_ids, heartbeat_interval_ms=HEARTBEAT_INTERVAL_MS
                )

    async def RecordHits(  # noqa: N802
        self, request: pb.RecordHitsRequest, context: Context
    ) -> pb.RecordHitsResponse:
        v = Violations()
        validation.check_recorded_hits(v, "hits", request.hits, self._limits)
        v.raise_if_any()
        hits = [NearHits(h.tenant_id, h.entry_id, h.count) for h in request.hits]
        return pb.RecordHitsResponse(recorded=await self._cache.record_hits(hits))


def _lookup_response(result: LookupResult) -> pb.LookupResponse:
    response = pb.LookupResponse(
        kind=_KINDS[result.kind], similarity=result.similarity, reason=result.reason
    )
    if result.hit is not None:
        response.entry_id = result.hit.entry_id
        response.response.MergeFromString(result.hit.response)
        response.response.created_at.FromMilliseconds(result.hit.created_ms)
        if result.hit.expires_ms:
            response.expires_at.FromMilliseconds(result.hit.expires_ms)
    return response


def _stats_response(view: StatsView, budget_bytes: int) -> pb.StatsResponse:
    c = view.counters
    lookups = c.lookups or 1  # rates are 0 without lookups
    return pb.StatsResponse(
        entries=view.entries,
        bytes=view.bytes,
        lookups=c.lookups,
        exact_hits=c.exact_hits,
        semantic_hits=c.semantic_hits,
        misses=c.misses,
        dropped_stores=c.dropped_stores,
        budget_bytes=budget_bytes,
        evictions=c.evictions,
        guard_rejections=c.guard_rejections,
        exact_hit_rate=c.exact_hits / lookups,
        semantic_hit_rate=c.semantic_hits / lookups,
        store_available=view.store_available,
        stores=c.stores,
        indexed_vectors=view.indexed_vectors,
        index_ready=view.index_ready,
        near_hits=c.near_hits,
    )
