"""The billing outbox: settlements billing could not take, kept in llm_common.outbox (SQLite)
and replayed with jittered backoff, many per SettleBatch call when `batch_max` > 0. Settle
and Release are idempotent by request id, so a replay after a partial success counts once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from llm_common.errors import DeadlineExceeded, ServiceError, Unavailable
from llm_common.logging import get_logger
from llm_common.outbox import Delivery, Outbox, OutboxItem, ReplayStats
from llm_router.clients.billing import BillingClient, ItemResult
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
    """Spool (settlement.Spool) over an Outbox, and the replay loop that empties it: one
    call per stored item, or up to `batch_max` items per SettleBatch call."""

    def __init__(
        self,
        outbox: Outbox,
        billing: BillingClient,
        *,
        timeout_s: float,
        metrics: RouterMetrics,
        batch_max: int = 0,
        idle_poll_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._outbox = outbox
        self._billing = billing
        self._timeout_s = timeout_s
        self._metrics = metrics
        self._batch_max = batch_max
        self._idle_poll_s = idle_poll_s
        self._clock = clock  # the outbox's clock (epoch seconds)
        self._stop = asyncio.Event()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def outbox(self) -> Outbox:
        return self._outbox

    async def put(self, request: BillingCall) -> None:
        key, payload = encode(request)
        await self._outbox.put(key, payload)
        self._wakeup.set()

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
        except ServiceError as err:
            return self._delivery(item, err)
        return self._delivery(item, None)

    async def replay_batch(self) -> ReplayStats:
        """Send up to `batch_max` due items in one SettleBatch and record each outcome; when
        the whole call fails, every item is retried later."""
        items = await self._outbox.due(self._batch_max)
        calls: list[tuple[OutboxItem, BillingCall]] = []
        rejected = 0
        for item in items:
            try:
                calls.append((item, decode(item.payload)))
            except ValueError:
                await self._outbox.reject(item, "undecodable payload")
                rejected += 1
        if not calls:
            return ReplayStats(rejected=rejected)
        results = await self._send_batch([call for _, call in calls])
        delivered: list[str] = []
        retried = 0
        for (item, _), result in zip(calls, results, strict=True):
            outcome = self._delivery(item, result)
            if outcome is Delivery.DELIVERED:
                delivered.append(item.key)
            elif outcome is Delivery.REJECTED:
                await self._outbox.reject(item, type(result).__name__)
                rejected += 1
            else:
                await self._outbox.retry_later(item, type(result).__name__)
                retried += 1
        await self._outbox.mark_delivered(*delivered)
        return ReplayStats(len(delivered), retried, rejected)

    async def _send_batch(self, calls: Sequence[BillingCall]) -> list[ItemResult | None]:
        """Per call: None when delivered, else its error (the whole call's, if it failed)."""
        try:
            results = await self._billing.settle_batch(calls, self._timeout_s)
        except ServiceError as err:
            return [err] * len(calls)
        return [r if isinstance(r, Exception) else None for r in results]

    def _delivery(self, item: OutboxItem, error: ItemResult | None) -> Delivery:
        if error is None:
            self._metrics.settlements.labels("replayed").inc()
            return Delivery.DELIVERED
        if isinstance(error, Unavailable | DeadlineExceeded) or not isinstance(error, ServiceError):
            return Delivery.RETRY
        _log.error("billing refused a spooled settlement", key=item.key, code=error.code.name)
        self._metrics.settlements.labels("replay_rejected").inc()
        return Delivery.REJECTED

    def start(self) -> None:
        """Replay in the background until `stop`."""
        self._stop.clear()
        loop = asyncio.get_running_loop()
        if self._batch_max > 0:
            self._task = loop.create_task(self._run_batches())
        else:
            self._task = loop.create_task(self._outbox.run(self.send, self._stop))

    async def _run_batches(self) -> None:
        """Like Outbox.run, a batch at a time: again at once after progress, else when the
        next item is due, something is spooled, or `idle_poll_s` passed."""
        while not self._stop.is_set():
            self._wakeup.clear()
            try:
                stats = await self.replay_batch()
            except Exception:  # e.g. the disk: keep the loop alive, try again later
                _log.exception("outbox replay failed")
                await self._sleep(self._idle_poll_s)
                continue
            if stats.delivered + stats.rejected > 0 and stats.retried == 0:
                continue
            await self._sleep(await self._wait_s())

    async def _wait_s(self) -> float:
        next_due = await self._outbox.next_due_at()
        if next_due is None:
            return self._idle_poll_s
        return max(0.0, min(self._idle_poll_s, next_due - self._clock()))

    async def _sleep(self, seconds: float) -> None:
        waiters = [
            asyncio.ensure_future(self._stop.wait()),
            asyncio.ensure_future(self._wakeup.wait()),
        ]
        try:
            await asyncio.wait(waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()

    async def stop(self) -> None:
        self._stop.set()
        self._wakeup.set()
        if self._task is not None:
            await self._task
            self._task = None
