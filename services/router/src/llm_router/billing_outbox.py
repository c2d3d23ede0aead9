"""The billing outbox: settlements billing could not take, kept in llm_common.outbox (SQLite)
and replayed with jittered backoff. Settle and Release are idempotent by request id, so a
replay after a partial success counts once."""

from __future__ import annotations

import asyncio

from llm_common.errors import DeadlineExceeded, ServiceError, Unavailable
from llm_common.logging import get_logger
from llm_common.outbox import Delivery, Outbox, OutboxItem
from llm_router.clients import BillingClient
from llm_router.observability import RouterMetrics
from llmapi.billing.v1 import billing_service_pb2 as billing_pb

_log = get_logger(__name__)
_SETTLE = b"S"
_RELEASE = b"R"

BillingCall = billing_pb.SettleRequest | billing_pb.ReleaseRequest


def encode(request: BillingCall) -> tuple[str, bytes]:
    """The outbox key and payload of a billing call (a type byte, then the message)."""
    kind = _SETTLE if isinstance(request, billing_pb.SettleRequest) else _RELEASE
    key = f"billing:{kind.decode()}:{request.request_id}"
    return key, kind + request.SerializeToString(deterministic=True)


def decode(payload: bytes) -> BillingCall:
    """The billing call of a payload written by `encode`."""
    kind, body = payload[:1], payload[1:]
    if kind == _SETTLE:
        return billing_pb.SettleRequest.FromString(body)
    if kind == _RELEASE:
        return billing_pb.ReleaseRequest.FromString(body)
    raise ValueError(f"unknown billing outbox record type {kind!r}")


class BillingSpool:
    """Spool (settlement.Spool) over an Outbox, and the replay loop that empties it."""

    def __init__(
        self, outbox: Outbox, billing: BillingClient, *, timeout_s: float, metrics: RouterMetrics
    ) -> None:
        self._outbox = outbox
        self._billing = billing
        self._timeout_s = timeout_s
        self._metrics = metrics
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def outbox(self) -> Outbox:
        return self._outbox

    async def put(self, request: BillingCall) -> None:
        key, payload = encode(request)
        await self._outbox.put(key, payload)

    async def send(self, item: OutboxItem) -> Delivery:
        """Deliver one stored call: DELIVERED, RETRY on outage, REJECTED when billing refuses."""
        try:
            request = decode(item.payload)
        except ValueError:
            return Delivery.REJECTED
        try:
            if isinstance(request, billing_pb.SettleRequest):
                await self._billing.settle(request, self._timeout_s)
            else:
                await self._billing.release(request.request_id, request.tenant_id, self._timeout_s)
        except (Unavailable, DeadlineExceeded):
            return Delivery.RETRY
        except ServiceError as err:
            _log.error("billing refused a spooled settlement", key=item.key, code=err.code.name)
            self._metrics.settlements.labels("replay_rejected").inc()
            return Delivery.REJECTED
        self._metrics.settlements.labels("replayed").inc()
        return Delivery.DELIVERED

    def start(self) -> None:
        """Replay in the background until `stop`."""
        self._stop.clear()
        self._task = asyncio.get_running_loop().create_task(self._outbox.run(self.send, self._stop))

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
            self._task = None
