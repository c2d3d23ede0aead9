"""What every downstream client shares: gRPC errors as domain errors, and breakers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from llm_common.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
)
from llm_common.resilience import AsyncBreaker, BreakerOpen
from llm_router.errors import DependencyUnavailable, from_rpc_error

T = TypeVar("T")
# Business answers, not faults: they never trip a breaker.
BUSINESS_ERRORS = (QuotaExceeded, InvalidArgument, NotFound, PermissionDenied, FailedPrecondition)


async def call(service: str, fn: Callable[[], Awaitable[T]]) -> T:
    """`fn()`, its gRPC failure raised as the domain error for `service`."""
    try:
        return await fn()
    except grpc.aio.AioRpcError as err:
        raise from_rpc_error(err, service) from None


async def guarded(breaker: AsyncBreaker | None, service: str, fn: Callable[[], Awaitable[T]]) -> T:
    """As `call`, through `breaker` when there is one (open: DependencyUnavailable)."""
    if breaker is None:
        return await call(service, fn)
    try:
        return await breaker.call(call, service, fn)
    except BreakerOpen:
        raise DependencyUnavailable(service) from None


def new_breaker(name: str, *, fail_max: int, reset_s: float) -> AsyncBreaker:
    """A breaker that counts outages and timeouts, not business refusals."""
    return AsyncBreaker(name, fail_max=fail_max, reset_timeout_s=reset_s, exclude=BUSINESS_ERRORS)
