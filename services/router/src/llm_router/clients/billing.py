"""llmapi.billing.v1: two-phase metering (Reserve, Settle/Release) and their batch calls."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import grpc

from llm_common.logging import get_logger
from llm_common.resilience import AsyncBreaker
from llm_router.clients.batching import BatchShape, CallBatcher
from llm_router.clients.calls import guarded
from llm_router.errors import DependencyUnavailable, from_rpc_error
from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.billing.v1 import billing_service_pb2_grpc as billing_grpc

BillingCall = billing_pb.SettleRequest | billing_pb.ReleaseRequest
CallResponse = billing_pb.SettleResponse | billing_pb.ReleaseResponse
# Per item of a batch: its response, or the error the unary call would have raised.
ItemResult = CallResponse | Exception
ReserveResult = billing_pb.ReserveResponse | Exception
# Settles and releases coalesced into SettleBatch calls (BillingClient.settle_batch).
SettleBatcher = CallBatcher[BillingCall, CallResponse]
_log = get_logger(__name__)
# After an UNIMPLEMENTED ReserveBatch, how long Reserves stay unary before batching is tried
# again (the billing may have been upgraded meanwhile).
RESERVE_BATCH_RETRY_S = 60.0


class BillingClient:
    """Two-phase metering at the billing service.

    With `reserve_batch`, the Reserve calls of concurrent admissions share ReserveBatch calls
    (a lone one still goes out at once, as a unary Reserve). A billing that predates
    ReserveBatch answers UNIMPLEMENTED: Reserves are then unary calls for
    `reserve_batch_retry_s`, after which batching is tried again.
    """

    service = "billing"

    def __init__(
        self,
        channel: grpc.aio.Channel,
        timeout_s: float,
        breaker: AsyncBreaker | None,
        *,
        reserve_batch: BatchShape | None = None,
        reserve_batch_retry_s: float = RESERVE_BATCH_RETRY_S,
    ) -> None:
        self._stub = billing_grpc.BillingServiceStub(channel)
        self._timeout_s = timeout_s
        self._breaker = breaker
        self._reserves: (
            CallBatcher[billing_pb.ReserveRequest, billing_pb.ReserveResponse] | None
        ) = None
        if reserve_batch is not None:
            self._reserves = CallBatcher(
                self.reserve_batch,
                max_items=reserve_batch.max_items,
                wait_s=reserve_batch.wait_s,
                timeout_s=timeout_s,
                max_in_flight=reserve_batch.max_in_flight,
                span_name="router.reserve_batch",
            )
        self._batch_retry_s = reserve_batch_retry_s
        self._unary_reserves_until = 0.0  # monotonic time; set by an UNIMPLEMENTED answer

    async def reserve(self, request: billing_pb.ReserveRequest) -> billing_pb.ReserveResponse:
        """Hold the worst-case cost; QuotaExceeded over a hard budget."""
        if self._reserves is not None:
            return await self._reserves.submit(request)
        return await self._reserve_one(request, self._timeout_s)

    async def _reserve_one(
        self, request: billing_pb.ReserveRequest, timeout_s: float
    ) -> billing_pb.ReserveResponse:
        return await guarded(
            self._breaker, self.service, lambda: self._stub.Reserve(request, timeout=timeout_s)
        )

    async def reserve_batch(
        self, requests: Sequence[billing_pb.ReserveRequest], timeout_s: float
    ) -> list[ReserveResult]:
        """Reserve many requests in one call; per request its response or the domain error
        the unary call would have raised. A failure of the whole call is raised."""
        if len(requests) == 1 or time.monotonic() < self._unary_reserves_until:
            # One item, or an older billing: unary calls, each with its own outcome.
            return list(
                await asyncio.gather(*(self._reserve_outcome(r, timeout_s) for r in requests))
            )
        request = billing_pb.ReserveBatchRequest(items=requests)
        response = await guarded(
            self._breaker, self.service, lambda: self._reserve_batch_call(request, timeout_s)
        )
        if response is None:  # UNIMPLEMENTED: this billing has no ReserveBatch
            self._unary_reserves_until = time.monotonic() + self._batch_retry_s
            _log.warning(
                "billing has no ReserveBatch: reserving with unary calls",
                retry_in_s=self._batch_retry_s,
            )
            return await self.reserve_batch(requests, timeout_s)
        if len(response.results) != len(requests):  # a broken billing: treat it as down
            raise DependencyUnavailable(self.service)
        return [_reserve_result(r, self.service) for r in response.results]

    async def _reserve_outcome(
        self, request: billing_pb.ReserveRequest, timeout_s: float
    ) -> ReserveResult:
        try:
            return await self._reserve_one(request, timeout_s)
        except Exception as err:  # the item's own outcome, as a batch item's status is
            return err

    async def _reserve_batch_call(
        self, request: billing_pb.ReserveBatchRequest, timeout_s: float
    ) -> billing_pb.ReserveBatchResponse | None:
        try:
            return await self._stub.ReserveBatch(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            raise

    async def settle(
        self, request: billing_pb.SettleRequest, timeout_s: float
    ) -> billing_pb.SettleResponse:
        """Record the actual usage (idempotent by request id)."""
        return await guarded(
            self._breaker, self.service, lambda: self._stub.Settle(request, timeout=timeout_s)
        )

    async def release(self, request_id: str, tenant_id: str, timeout_s: float) -> bool:
        """Cancel a reservation that produced nothing."""
        request = billing_pb.ReleaseRequest(request_id=request_id, tenant_id=tenant_id)
        response = await guarded(
            self._breaker, self.service, lambda: self._stub.Release(request, timeout=timeout_s)
        )
        return response.released

    async def settle_batch(
        self, calls: Sequence[BillingCall], timeout_s: float
    ) -> list[ItemResult]:
        """Settle/Release many requests in one call; per call its response or the domain
        error the unary call would have raised. A failure of the whole call is raised."""
        request = billing_pb.SettleBatchRequest(items=[_batch_item(c) for c in calls])
        response = await guarded(
            self._breaker, self.service, lambda: self._stub.SettleBatch(request, timeout=timeout_s)
        )
        if len(response.results) != len(calls):  # a broken billing: treat it as down
            raise DependencyUnavailable(self.service)
        return [_item_result(r, self.service) for r in response.results]


def _batch_item(call: BillingCall) -> billing_pb.SettleBatchItem:
    if isinstance(call, billing_pb.SettleRequest):
        return billing_pb.SettleBatchItem(settle=call)
    return billing_pb.SettleBatchItem(release=call)


def _item_result(result: billing_pb.SettleBatchResult, service: str) -> ItemResult:
    if result.status.code != grpc.StatusCode.OK.value[0]:
        return from_rpc_error(_ItemStatusError(result.status), service)
    if result.WhichOneof("response") == "release":
        return result.release
    return result.settle


def _reserve_result(result: billing_pb.ReserveBatchResult, service: str) -> ReserveResult:
    if result.status.code != grpc.StatusCode.OK.value[0]:
        return from_rpc_error(_ItemStatusError(result.status), service)
    return result.reservation


class _ItemStatusError(grpc.RpcError):
    """A batch item's status as a caught RpcError, so that it maps to the same domain
    error (details included) as a failed unary call."""

    def __init__(self, status: billing_pb.BatchItemStatus) -> None:
        super().__init__(status.message)
        self._status = status
        codes = {c.value[0]: c for c in grpc.StatusCode}
        self._code = codes.get(status.code, grpc.StatusCode.UNKNOWN)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._status.message

    def trailing_metadata(self) -> tuple[Any, ...]:  # (key, value) pairs
        # BatchItemStatus has google.rpc.Status's wire format.
        return (("grpc-status-details-bin", self._status.SerializeToString()),)
