"""Settlement: bill what was produced, refund the unused token quota, spool what billing
could not take so nothing is lost (the outbox replays it; Settle is idempotent)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from google.protobuf import timestamp_pb2

from llm_common.errors import DeadlineExceeded, ServiceError, Unavailable
from llm_common.logging import LogThrottle, get_logger
from llm_router.admission.quota_lease import Lease, QuotaLeases
from llm_router.background import Background
from llm_router.clients.billing import BillingClient, SettleBatcher
from llm_router.clients.quota import QuotaClient
from llm_router.observability import RouterMetrics
from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.common.v1 import common_pb2

_log = get_logger(__name__)


class Spool(Protocol):
    """Durable storage for billing calls that could not be delivered now."""

    async def put(self, request: billing_pb.SettleRequest | billing_pb.ReleaseRequest) -> None:
        """Persist `request` (fsync'd) for later delivery; raises if it cannot."""


@dataclass(frozen=True, slots=True)
class Admission:
    """What admission held for a request, needed to settle it."""

    billing_id: str  # idempotency id at billing and auth
    tenant_id: str
    key_id: str  # auth's key id (API key id or jwt:<subject>)
    billing_key_id: str  # key id as billing accepts it; empty for JWT callers
    model: str
    prompt_tokens: int
    max_tokens: int
    quota_tokens: int  # reserved at auth; 0 when not reserved (no auth, failed open)
    billing_reserved: bool  # False when admitted while billing was unreachable
    admitted_at_s: float  # epoch seconds
    quota_lease: Lease | None = None  # where quota_tokens were drawn from, if not reserved


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a request actually used."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    finish_reason: common_pb2.FinishReason.ValueType
    produced: bool  # False: nothing was generated or served (release, don't settle)


class Settler:
    """Settles in the background so the response is not held up by billing; with a
    `batcher`, settles and releases share SettleBatch calls (else one call each)."""

    def __init__(
        self,
        billing: BillingClient,
        quota: QuotaClient | None,
        spool: Spool,
        *,
        timeout_s: float,
        metrics: RouterMetrics,
        background: Background,
        batcher: SettleBatcher | None = None,
        leases: QuotaLeases | None = None,
    ) -> None:
        self._billing = billing
        self._batcher = batcher
        self._quota = quota
        self._spool = spool
        self._timeout_s = timeout_s
        self._metrics = metrics
        self._background = background
        self._leases = leases
        self._spooled_log = LogThrottle()  # one line per outage period, not per request

    def submit(self, admission: Admission, outcome: Outcome) -> asyncio.Task[None]:
        """Settle `admission` with `outcome` in a background task (see Background)."""
        return self._background.spawn(self.settle(admission, outcome))

    async def settle(self, admission: Admission, outcome: Outcome) -> None:
        """Refund unused quota, then settle what was produced (or release the reservation)
        at billing, spooling on outage."""
        await self._refund(admission, outcome)
        request: billing_pb.SettleRequest | billing_pb.ReleaseRequest
        if outcome.produced:
            request = settle_request(admission, outcome)
        elif admission.billing_reserved:
            request = billing_pb.ReleaseRequest(
                request_id=admission.billing_id, tenant_id=admission.tenant_id
            )
        else:
            return  # nothing produced and nothing held at billing
        await self._deliver(request)

    async def _deliver(self, request: billing_pb.SettleRequest | billing_pb.ReleaseRequest) -> None:
        try:
            await self._send(request)
        except (Unavailable, DeadlineExceeded):
            await self._to_spool(request)
        except ServiceError as err:
            # Billing refused the record itself; retrying cannot help. Logged for follow-up.
            self._metrics.settlements.labels("failed").inc()
            _log.error(
                "settlement refused by billing",
                billing_id=request.request_id,
                code=err.code.name,
                error=err.message,
            )
            return
        settled = isinstance(request, billing_pb.SettleRequest)
        self._metrics.settlements.labels("settled" if settled else "released").inc()

    async def _send(self, request: billing_pb.SettleRequest | billing_pb.ReleaseRequest) -> None:
        if self._batcher is not None:
            await self._batcher.submit(request)
        elif isinstance(request, billing_pb.SettleRequest):
            await self._billing.settle(request, self._timeout_s)
        else:
            await self._billing.release(request.request_id, request.tenant_id, self._timeout_s)

    async def flush(self) -> None:
        """Send the queued settlements now (shutdown); `Background.drain` then waits for
        their tasks."""
        if self._batcher is not None:
            await self._batcher.flush()

    async def _to_spool(
        self, request: billing_pb.SettleRequest | billing_pb.ReleaseRequest
    ) -> None:
        try:
            await self._spool.put(request)
        except Exception:
            self._metrics.settlements.labels("lost").inc()
            _log.exception("could not spool a settlement", billing_id=request.request_id)
            return
        self._metrics.settlements.labels("spooled").inc()
        if (left_out := self._spooled_log.due()) is not None:
            _log.warning(
                "billing unavailable: settlement spooled",
                billing_id=request.request_id,
                left_out=left_out,
            )

    async def _refund(self, admission: Admission, outcome: Outcome) -> None:
        unused = admission.quota_tokens - (outcome.prompt_tokens + outcome.completion_tokens)
        if admission.quota_lease is not None:
            assert self._leases is not None
            self._leases.release(admission.quota_lease, unused)  # back to the lease, no call
            return
        if self._quota is None or admission.quota_tokens <= 0 or unused <= 0:
            return
        try:
            await self._quota.refund(
                admission.tenant_id, admission.key_id, admission.billing_id, unused, self._timeout_s
            )
        except ServiceError as err:
            # Not spooled: the reservation ages out of the per-minute window by itself.
            self._metrics.degraded.labels("auth", "refund_skipped").inc()
            _log.warning("token refund failed", billing_id=admission.billing_id, code=err.code.name)


def settle_request(admission: Admission, outcome: Outcome) -> billing_pb.SettleRequest:
    """The Settle call, complete enough to record the usage even without a reservation."""
    # Built from its fields: Timestamp.FromNanoseconds runs Python code for every settle.
    nanos = int(admission.admitted_at_s * 1e9)
    admitted_at = timestamp_pb2.Timestamp(seconds=nanos // 10**9, nanos=nanos % 10**9)
    return billing_pb.SettleRequest(
        request_id=admission.billing_id,
        prompt_tokens=outcome.prompt_tokens,
        completion_tokens=outcome.completion_tokens,
        cached_tokens=min(outcome.cached_tokens, outcome.prompt_tokens),
        finish_reason=outcome.finish_reason,
        tenant_id=admission.tenant_id,
        key_id=admission.billing_key_id,
        model=admission.model,
        admitted_at=admitted_at,
    )
