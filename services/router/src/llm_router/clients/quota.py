"""llmapi.auth.v1 token quota: tokens-per-minute reservations at the auth service."""

from __future__ import annotations

import grpc

from llm_common.resilience import AsyncBreaker
from llm_router.clients.calls import guarded
from llmapi.auth.v1 import auth_service_pb2 as auth_pb
from llmapi.auth.v1 import auth_service_pb2_grpc as auth_grpc


class QuotaClient:
    """Tokens-per-minute reservations at the auth service."""

    service = "auth"

    def __init__(
        self, channel: grpc.aio.Channel, timeout_s: float, breaker: AsyncBreaker | None
    ) -> None:
        self._stub = auth_grpc.AuthServiceStub(channel)
        self._timeout_s = timeout_s
        self._breaker = breaker

    async def reserve(
        self, tenant: str, key: str, tokens: int, reservation_id: str
    ) -> auth_pb.ReserveTokensResponse:
        """Hold `tokens`; RESOURCE_EXHAUSTED (QuotaExceeded) over the key's limit.

        Nothing was held (and nothing is to be refunded) when the answer's `limit` is 0: the
        key is unlimited (`enforced`), or auth's limiter was down and it failed open.
        """
        request = auth_pb.ReserveTokensRequest(
            tenant_id=tenant, key_id=key, tokens=tokens, reservation_id=reservation_id
        )
        response: auth_pb.ReserveTokensResponse = await guarded(
            self._breaker,
            self.service,
            lambda: self._stub.ReserveTokens(request, timeout=self._timeout_s),
        )
        return response

    async def refund(
        self, tenant: str, key: str, reservation_id: str, tokens: int, timeout_s: float
    ) -> None:
        """Give back `tokens` of a reservation (idempotent per reservation)."""
        request = auth_pb.RefundTokensRequest(
            tenant_id=tenant, key_id=key, reservation_id=reservation_id, tokens=tokens
        )
        await guarded(
            self._breaker, self.service, lambda: self._stub.RefundTokens(request, timeout=timeout_s)
        )
