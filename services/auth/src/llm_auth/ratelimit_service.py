"""Envoy's envoy.service.ratelimit.v3.RateLimitService over the RateLimitPolicy."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from envoy.service.ratelimit.v3 import rls_pb2_grpc as rls_grpc
from google.protobuf import duration_pb2

from llm_auth.descriptors import SECONDS_UNIT, parse_request
from llm_auth.rls import RateLimitPolicy, Verdict

Context = grpc.aio.ServicerContext[Any, Any]
_OK = rls_pb2.RateLimitResponse.OK
_OVER_LIMIT = rls_pb2.RateLimitResponse.OVER_LIMIT


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
            retry_after = max(1, math.ceil(max(v.retry_after_s for v in over)))
            response.response_headers_to_add.append(
                base_pb2.HeaderValue(key="retry-after", value=str(retry_after))
            )
        return response


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
