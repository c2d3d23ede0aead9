"""Envoy's envoy.service.ratelimit.v3.RateLimitService over the RateLimitPolicy."""

from __future__ import annotations

import asyncio
import base64
import math
from collections.abc import Sequence
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from envoy.service.ratelimit.v3 import rls_pb2_grpc as rls_grpc
from google.protobuf import duration_pb2

from llm_auth.descriptors import SECONDS_UNIT, Descriptor, parse_request
from llm_auth.rls import RateLimitPolicy, Verdict
from llm_common.errors import QuotaExceeded, QuotaViolation

Context = grpc.aio.ServicerContext[Any, Any]
_OK = rls_pb2.RateLimitResponse.OK
_OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT
# gRPC's rich-status trailer: Envoy adds response_headers_to_add to its local reply, which for
# a gRPC call is trailers-only, so the client reads QuotaFailure and RetryInfo from it.
STATUS_DETAILS_HEADER = "grpc-status-details-bin"


class RateLimitServicer(rls_grpc.RateLimitServiceServicer):  # type: ignore[misc]
    """ShouldRateLimit: every descriptor is charged independently (as Envoy's reference
    service does); the answer is OVER_LIMIT when any one is over, with `retry-after`."""

    def __init__(self, policy: RateLimitPolicy) -> None:
        self._policy = policy

    async def ShouldRateLimit(self, request: Any, context: Context) -> Any:  # noqa: N802
        domain, descriptors = parse_request(request)
        # Descriptors are independent: decided concurrently, their Redis calls overlap.
        verdicts = await asyncio.gather(*(self._policy.decide(domain, d) for d in descriptors))
        over = [v for v in verdicts if not v.allowed]
        response = rls_pb2.RateLimitResponse(
            overall_code=_OVER_LIMIT if over else _OK,
            statuses=[_status(v) for v in verdicts],
        )
        if over:
            _explain(response, descriptors, verdicts)
        return response


def _explain(response: Any, descriptors: Sequence[Descriptor], verdicts: Sequence[Verdict]) -> None:
    """An over-limit answer says why and when to retry: `retry-after`, a body (Envoy's local
    reply body, grpc-message for gRPC callers) and the rich status with RetryInfo."""
    over = [(d, v) for d, v in zip(descriptors, verdicts, strict=True) if not v.allowed]
    retry_after = max(1, math.ceil(max(v.retry_after_s for _, v in over)))
    error = QuotaExceeded(
        [QuotaViolation(_subject(d), _limit(v)) for d, v in over],
        retry_after_s=float(retry_after),
        message=f"rate limit exceeded; retry after {retry_after} s",
    )
    details = base64.b64encode(error.to_proto().SerializeToString()).decode("ascii")
    response.response_headers_to_add.extend(
        [
            base_pb2.HeaderValue(key="retry-after", value=str(retry_after)),
            base_pb2.HeaderValue(key=STATUS_DETAILS_HEADER, value=details),
        ]
    )
    response.raw_body = error.message.encode()


def _subject(descriptor: Descriptor) -> str:
    """`key:<id>` or `tenant:<id>` (never a credential: descriptors carry ids only)."""
    key_id, tenant = descriptor.get("key_id"), descriptor.get("tenant")
    return f"key:{key_id}" if key_id else f"tenant:{tenant or '-'}"


def _limit(verdict: Verdict) -> str:
    if verdict.limit <= 0:
        return "rate limit"
    return f"{verdict.limit} per {verdict.period_s:g} s"


def _status(verdict: Verdict) -> Any:
    status = rls_pb2.RateLimitResponse.DescriptorStatus(
        code=_OK if verdict.allowed else _OVER_LIMIT
    )
    unit = SECONDS_UNIT.get(verdict.period_s)
    if verdict.limit > 0 and unit is not None:
        status.current_limit.requests_per_unit = verdict.limit
        status.current_limit.unit = unit
        status.limit_remaining = verdict.remaining
        reset = duration_pb2.Duration()
        reset.FromNanoseconds(round(verdict.reset_after_s * 1e9))
        status.duration_until_reset.CopyFrom(reset)
    return status
