"""llmapi.cache.v1: the response cache; callers treat its failures as misses."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc

from llm_common.resilience import AsyncBreaker
from llm_router.clients.calls import guarded
from llmapi.cache.v1 import cache_service_pb2 as cache_pb
from llmapi.cache.v1 import cache_service_pb2_grpc as cache_grpc


class CacheClient:
    """The response cache; callers treat its failures as misses."""

    service = "cache"

    def __init__(
        self, channel: grpc.aio.Channel, timeout_s: float, breaker: AsyncBreaker | None
    ) -> None:
        self._stub = cache_grpc.CacheServiceStub(channel)
        self._timeout_s = timeout_s
        self._breaker = breaker

    async def lookup(self, request: cache_pb.LookupRequest) -> cache_pb.LookupResponse:
        return await guarded(
            self._breaker, self.service, lambda: self._stub.Lookup(request, timeout=self._timeout_s)
        )

    async def store(self, request: cache_pb.StoreRequest, timeout_s: float) -> bool:
        response = await guarded(
            self._breaker, self.service, lambda: self._stub.Store(request, timeout=timeout_s)
        )
        return response.stored

    async def record_hits(self, hits: Sequence[cache_pb.RecordedHit], timeout_s: float) -> int:
        """Account exact hits served from the router's near cache."""
        request = cache_pb.RecordHitsRequest(hits=hits)
        response = await guarded(
            self._breaker, self.service, lambda: self._stub.RecordHits(request, timeout=timeout_s)
        )
        return response.recorded

    async def watch_changes(self) -> AsyncIterator[cache_pb.WatchChangesResponse]:
        """The cache's change feed until the stream breaks (AioRpcError). No breaker: a
        long-lived stream is no sample of the cache's health."""
        call = self._stub.WatchChanges(cache_pb.WatchChangesRequest())
        try:
            async for message in call:
                yield message
        finally:
            call.cancel()
