"""Admission: reserve the worst case — tokens per minute at auth, cost at billing — before any
work is dispatched, degrading per policy when either cannot be reached."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import time
import uuid
from collections.abc import Callable

from llm_common.bounded_map import BoundedTTLMap
from llm_common.errors import (
    FailedPrecondition,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
    Unavailable,
)
from llm_common.logging import LogThrottle, get_logger
from llm_router.admission.quota_lease import Lease, QuotaLeases
from llm_router.admission.quota_memo import UnlimitedKeys
from llm_router.api.identity import Caller
from llm_router.clients.billing import BillingClient
from llm_router.clients.quota import QuotaClient
from llm_router.observability import RouterMetrics
from llm_router.safety.policies import AdmissionPolicy
from llm_router.settlement.settle import Admission, Outcome, Settler
from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.common.v1 import common_pb2

_log = get_logger(__name__)
NOTHING = Outcome(0, 0, 0, common_pb2.FINISH_REASON_UNSPECIFIED, produced=False)


def is_idempotent(request_id: str) -> bool:
    """Whether `request_id` (from billing_id) derives from the client's own request id."""
    return request_id.startswith("i")


def billing_id(caller: Caller, client_request_id: str, fingerprint: bytes) -> str:
    """The idempotency id at billing and auth for one request.

    A client's request_id makes retries of the *same* request idempotent: the id hashes the
    tenant, key, client id and the request itself, so re-using an id for a different request
    is billed again instead of riding on the first one. Without a client id every call is
    billed on its own (a fresh id).
    """
    if not client_request_id:
        return "r" + uuid.uuid4().hex
    h = hashlib.blake2b(digest_size=16)
    for part in (caller.tenant_id, caller.key_id, client_request_id):
        h.update(part.encode("utf-8") + b"\0")
    h.update(fingerprint)
    return "i" + h.hexdigest()


class RefusalMemo:
    """Callers refused recently (quota or budget), until their RetryInfo says to come back.

    The pipeline overlaps admission with the start of generation; for these callers it does
    not, so a client hammering past its limit cannot make replicas prefill for nothing.
    """

    def __init__(
        self,
        *,
        max_entries: int = 100_000,
        max_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # Each caller expires when its own RetryInfo period ends.
        self._refused: BoundedTTLMap[tuple[str, str], bool] = BoundedTTLMap(
            max_entries, clock=clock
        )
        self._max_s = max_s

    def refused(self, caller: Caller, retry_after_s: float | None) -> None:
        ttl_s = min(retry_after_s or 1.0, self._max_s)
        self._refused.put((caller.tenant_id, caller.key_id), True, ttl_s=ttl_s)

    def recent(self, caller: Caller) -> bool:
        return (caller.tenant_id, caller.key_id) in self._refused


class Admitter:
    """Reserves quota and budget (concurrently); on refusal nothing stays reserved."""

    def __init__(
        self,
        quota: QuotaClient | None,
        billing: BillingClient,
        settler: Settler,
        metrics: RouterMetrics,
        *,
        quota_fail_open: bool,
        refusals: RefusalMemo | None = None,
        unlimited: UnlimitedKeys | None = None,
        unbudgeted: UnlimitedKeys | None = None,
        leases: QuotaLeases | None = None,
    ) -> None:
        self._quota = quota
        self._billing = billing
        self._settler = settler
        self._metrics = metrics
        self._quota_fail_open = quota_fail_open
        self.refusals = refusals or RefusalMemo()
        self._unlimited = unlimited or UnlimitedKeys(ttl_s=0.0)
        self._unbudgeted = unbudgeted or UnlimitedKeys(ttl_s=0.0)
        self._leases = leases
        # One line per outage period, not per request (the degraded metric counts them all).
        self._auth_down_log = LogThrottle()
        self._billing_down_log = LogThrottle()

    async def admit(
        self,
        *,
        request_id: str,
        caller: Caller,
        model: str,
        prompt_tokens: int,
        max_tokens: int,
        policy: AdmissionPolicy,
    ) -> Admission:
        """Reserve prompt_tokens + max_tokens; RESOURCE_EXHAUSTED over a limit or budget.

        If the caller goes away meanwhile, what was reserved is given back once the
        reservations answer (they run on, shielded, so none is left behind).
        """
        admission = Admission(
            billing_id=request_id,
            tenant_id=caller.tenant_id,
            key_id=caller.key_id,
            billing_key_id=caller.billing_key_id,
            model=model,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            quota_tokens=0,
            billing_reserved=False,
            admitted_at_s=time.time(),
        )
        task = asyncio.ensure_future(self._reserve(admission, caller, policy))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._give_back)
            raise
        except QuotaExceeded as refusal:
            self.refusals.refused(caller, refusal.retry_after_s)
            raise

    def _give_back(self, task: asyncio.Future[Admission]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._settler.submit(task.result(), NOTHING)

    async def _reserve(
        self, admission: Admission, caller: Caller, policy: AdmissionPolicy
    ) -> Admission:
        tokens = admission.prompt_tokens + admission.max_tokens
        quota, budget = await asyncio.gather(
            self._reserve_quota(admission.billing_id, caller, tokens),
            self._reserve_budget(admission, policy),
            return_exceptions=True,
        )
        tokens_held, lease = quota if isinstance(quota, tuple) else (0, None)
        held = dataclasses.replace(
            admission,
            quota_tokens=tokens_held,
            quota_lease=lease,
            billing_reserved=budget is True,
        )
        error = next((r for r in (quota, budget) if isinstance(r, BaseException)), None)
        if error is not None:
            if held.quota_tokens or held.billing_reserved:
                self._settler.submit(held, NOTHING)  # refund / release what was granted
            raise error
        return held

    async def _reserve_quota(
        self, request_id: str, caller: Caller, tokens: int
    ) -> tuple[int, Lease | None]:
        """(tokens held, the lease they are drawn from, if any)."""
        if self._quota is None or not caller.key_id:
            return 0, None
        key = (caller.tenant_id, caller.key_id)
        if key in self._unlimited:
            self._metrics.quota_skipped.inc()
            return 0, None
        # Only fresh ids draw from a lease: a client's idempotent id reserves at auth, which
        # charges a retry of the same request once.
        if self._leases is not None and not is_idempotent(request_id):
            lease = await self._leases.draw(caller.tenant_id, caller.key_id, tokens)
            if lease is not None:
                return tokens, lease
        return await self._reserve_at_auth(request_id, caller, tokens), None

    async def _reserve_at_auth(self, request_id: str, caller: Caller, tokens: int) -> int:
        assert self._quota is not None
        try:
            grant = await self._quota.reserve(caller.tenant_id, caller.key_id, tokens, request_id)
        except NotFound:
            raise PermissionDenied(
                "the API key no longer exists", reason="API_KEY_INVALID"
            ) from None
        except Unavailable:
            if not self._quota_fail_open:
                raise
            self._metrics.degraded.labels("auth", "admitted_unchecked").inc()
            if (left_out := self._auth_down_log.due()) is not None:
                _log.warning("token quota unavailable: admitted without a check", left_out=left_out)
            return 0
        if grant.limit > 0:
            if self._leases is not None:
                self._leases.learn(caller.tenant_id, caller.key_id, grant.limit)
            return tokens  # held: the unused part is refunded at the end
        if grant.enforced:  # unlimited (not a fail-open answer): skip auth for a while
            self._unlimited.remember(caller.tenant_id, caller.key_id)
        return 0

    async def _reserve_budget(self, admission: Admission, policy: AdmissionPolicy) -> bool:
        """True when reserved; False when admitted without a reservation, its usage recorded
        at Settle all the same (billing unreachable, or no budget applies)."""
        # Only where the policy admits without billing: a `reject` tenant keeps learning of a
        # billing outage at admission, as before.
        unbudgeted = (admission.tenant_id, admission.billing_key_id, admission.model)
        if policy.billing_unavailable == "admit" and unbudgeted in self._unbudgeted:
            self._metrics.budget_skipped.inc()
            return False
        request = billing_pb.ReserveRequest(
            request_id=admission.billing_id,
            tenant_id=admission.tenant_id,
            key_id=admission.billing_key_id,
            model=admission.model,
            prompt_tokens=admission.prompt_tokens,
            max_completion_tokens=admission.max_tokens,
        )
        try:
            reservation = await self._billing.reserve(request)
        except QuotaExceeded:
            raise
        except NotFound:
            raise FailedPrecondition(f"model {admission.model!r} has no price") from None
        except Unavailable:
            if policy.billing_unavailable != "admit":
                raise
            self._metrics.degraded.labels("billing", "admitted_unreserved").inc()
            if (left_out := self._billing_down_log.due()) is not None:
                _log.warning(
                    "billing unavailable: admitted, usage goes to the outbox", left_out=left_out
                )
            return False
        if reservation.unbudgeted:
            self._unbudgeted.remember(*unbudgeted)
        return True
