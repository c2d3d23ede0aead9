"""Token-quota leases: one auth reservation covers many requests of a key.

Reserving prompt + max_tokens at auth for every request, and refunding the unused part after
it, costs two calls per request on both sides. A lease reserves a block of the key's tokens
per minute once (ReserveTokens under its own id); the router's requests draw from it locally
and give back what they did not use; when the lease ends (`lease_s` after it was taken, or
when a request needs more than it has left) and its last request has settled, what it holds
unused is refunded in one call (RefundTokens). Auth's buckets count every leased token from
the moment it is leased, so the limit stays exact across any number of routers: nothing is
ever admitted that auth did not charge. The price is the other way round: tokens leased by one
router and not yet used or refunded are unavailable to the others, at most `max_share` of the
key's limit per router for about `lease_s`, so a key near its limit falls back to exact
per-request reservations (and, after a refused lease, stays there for `lease_s`).

A key is leased for only once the router knows its limit (from a per-request reservation's
answer), and only for requests without a client request id: those reserve under their
idempotent id, so a retried request is not charged twice.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Counter

from llm_common.bounded_map import BoundedTTLMap
from llm_common.errors import QuotaExceeded, ServiceError
from llm_common.logging import get_logger
from llm_router.background import Background
from llm_router.clients.quota import QuotaClient

_log = get_logger(__name__)

MIN_REQUESTS_PER_LEASE = 4  # the first lease of a key holds at least this many of its request
GROWTH = 1.5  # a lease is sized by what the key's previous one was drawn for, with headroom


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    """ROUTER_QUOTA_LEASE_S (0: off, every request reserves at auth) and
    ROUTER_QUOTA_LEASE_MAX_SHARE (the most of a key's per-minute limit one lease holds)."""

    lease_s: float = 2.0
    max_share: float = 0.05
    max_keys: int = 100_000


@dataclass(eq=False, slots=True)
class Lease:
    """Tokens reserved at auth under `lease_id`, drawn by this router's requests."""

    tenant_id: str
    key_id: str
    lease_id: str
    granted: int
    used: int = 0  # held by admitted requests, what they gave back subtracted
    drawn: int = 0  # everything ever drawn (sizes the key's next lease)
    in_flight: int = 0
    open: bool = True  # False: no more draws; refunded once the last request settles
    refunded: bool = False

    def take(self, tokens: int) -> Lease:
        self.used += tokens
        self.drawn += tokens
        self.in_flight += 1
        return self


@dataclass(slots=True)
class _Key:
    limit: int  # tokens per minute, from auth's last answer
    lease: Lease | None = None
    acquiring: asyncio.Future[Lease | None] | None = None
    last_drawn: int = 0  # what the previous lease was drawn for
    exact_until: float = 0.0  # after a refused lease: per-request reservations until then


class QuotaLeases:
    """The leases of every key this router serves (see the module doc)."""

    def __init__(
        self,
        quota: QuotaClient,
        settings: LeaseSettings,
        *,
        background: Background,
        events: Counter,
        refund_timeout_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._quota = quota
        self._settings = settings
        self._background = background
        self._events = events
        self._refund_timeout_s = refund_timeout_s
        self._clock = clock
        # Keys in the order they were learned (peek: reads do not reorder), the oldest
        # dropped beyond max_keys; a dropped key's live lease still expires and refunds
        # through its timer.
        self._keys: BoundedTTLMap[tuple[str, str], _Key] = BoundedTTLMap(settings.max_keys)

    def learn(self, tenant_id: str, key_id: str, limit: int) -> None:
        """Auth answered a reservation of this key with its per-minute limit (> 0)."""
        if self._settings.lease_s <= 0 or limit <= 0:
            return
        k = (tenant_id, key_id)
        state = self._keys.peek(k)
        if state is None:
            self._keys.put(k, _Key(limit))
        else:
            state.limit = limit

    async def draw(self, tenant_id: str, key_id: str, tokens: int) -> Lease | None:
        """A lease now holding `tokens` for one request, or None: reserve at auth instead."""
        state = self._keys.peek((tenant_id, key_id))
        if state is None or tokens > self._cap(state) or self._clock() < state.exact_until:
            return None
        lease = state.lease
        if lease is not None and lease.open and lease.granted - lease.used >= tokens:
            self._events.labels("drawn").inc()
            return lease.take(tokens)
        if state.acquiring is None:
            state.acquiring = asyncio.ensure_future(self._acquire(state, tenant_id, key_id, tokens))
        # Shielded: one caller going away must not cancel the lease the others wait for.
        lease = await asyncio.shield(state.acquiring)
        if lease is None or not lease.open or lease.granted - lease.used < tokens:
            return None  # shared out among the callers that waited for it
        self._events.labels("drawn").inc()
        return lease.take(tokens)

    def release(self, lease: Lease, unused: int) -> None:
        """A request of `lease` settled, leaving `unused` of what it drew."""
        lease.used -= max(0, min(unused, lease.used))
        lease.in_flight -= 1
        if not lease.open and lease.in_flight == 0:
            self._refund(lease)

    def close_all(self) -> None:
        """Shutdown: no more draws; every lease is refunded once its requests settled."""
        for _, state in self._keys.items():
            if state.lease is not None:
                self._close(state.lease)
                state.lease = None

    def _cap(self, state: _Key) -> int:
        return int(state.limit * self._settings.max_share)

    async def _acquire(self, state: _Key, tenant_id: str, key_id: str, tokens: int) -> Lease | None:
        try:
            if state.lease is not None:
                state.last_drawn = state.lease.drawn
                self._close(state.lease)
                state.lease = None
            wanted = max(tokens * MIN_REQUESTS_PER_LEASE, int(state.last_drawn * GROWTH))
            size = max(tokens, min(wanted, self._cap(state)))
            lease = Lease(tenant_id, key_id, "q" + uuid.uuid4().hex, size)
            try:
                grant = await self._quota.reserve(tenant_id, key_id, size, lease.lease_id)
            except QuotaExceeded:
                # Near the limit: exact per-request reservations strand nothing.
                self._events.labels("refused").inc()
                state.exact_until = self._clock() + self._settings.lease_s
                return None
            except ServiceError:
                return None  # the per-request reservation meets (and reports) the same fault
            if grant.limit <= 0:
                return None  # unlimited, or granted unchecked: nothing is held
            state.limit = grant.limit
            state.lease = lease
            self._events.labels("acquired").inc()
            asyncio.get_running_loop().call_later(
                self._settings.lease_s, self._expire, state, lease
            )
            return lease
        finally:
            state.acquiring = None

    def _expire(self, state: _Key, lease: Lease) -> None:
        if state.lease is lease:
            state.last_drawn = lease.drawn
            state.lease = None
        self._close(lease)

    def _close(self, lease: Lease) -> None:
        lease.open = False
        if lease.in_flight == 0:
            self._refund(lease)

    def _refund(self, lease: Lease) -> None:
        unused = lease.granted - lease.used
        if lease.refunded or unused <= 0:
            return
        lease.refunded = True
        self._background.spawn(self._send_refund(lease, unused))

    async def _send_refund(self, lease: Lease, unused: int) -> None:
        try:
            await self._quota.refund(
                lease.tenant_id, lease.key_id, lease.lease_id, unused, self._refund_timeout_s
            )
        except ServiceError as err:
            # Not retried: the tokens come back to the bucket as it refills.
            self._events.labels("refund_failed").inc()
            _log.warning("lease refund failed", lease_id=lease.lease_id, code=err.code.name)
            return
        self._events.labels("refunded").inc()
