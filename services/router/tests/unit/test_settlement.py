"""Settlement: refund the unused quota, settle what was produced or release, spool into the
durable outbox when billing is down, and replay it (fake billing/auth clients, real SQLite)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from llm_common.errors import InvalidArgument, QuotaExceeded
from llm_common.outbox import Delivery, Outbox
from llm_router.admission.admit import Admitter, billing_id
from llm_router.admission.quota_memo import UnlimitedKeys
from llm_router.api.identity import Caller
from llm_router.background import Background
from llm_router.errors import DependencyUnavailable
from llm_router.observability import RouterMetrics
from llm_router.safety.policies import AdmissionPolicy
from llm_router.settlement.outbox import BillingSpool, decode, encode
from llm_router.settlement.settle import Admission, Outcome, Settler
from llmapi.auth.v1 import auth_service_pb2 as auth_pb
from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.common.v1 import common_pb2

STOP = common_pb2.FINISH_REASON_STOP


class FakeBilling:
    def __init__(self) -> None:
        self.down = False
        self.refuse = False
        self.settled: list[billing_pb.SettleRequest] = []
        self.released: list[str] = []
        self.reserved: list[billing_pb.ReserveRequest] = []
        self.over_budget = False

    def _check(self) -> None:
        if self.down:
            raise DependencyUnavailable("billing")
        if self.refuse:
            raise InvalidArgument([])

    async def reserve(self, request: billing_pb.ReserveRequest) -> Any:
        self._check()
        if self.over_budget:
            raise QuotaExceeded([], retry_after_s=60)
        self.reserved.append(request)
        return billing_pb.ReserveResponse(request_id=request.request_id, unbudgeted=self.unbudgeted)

    unbudgeted = False

    async def settle(self, request: billing_pb.SettleRequest, timeout_s: float) -> Any:
        self._check()
        self.settled.append(request)
        return billing_pb.SettleResponse(request_id=request.request_id)

    async def release(self, request_id: str, tenant_id: str, timeout_s: float) -> bool:
        self._check()
        self.released.append(request_id)
        return True


class FakeQuota:
    def __init__(self) -> None:
        self.down = False
        self.reserved: list[tuple[str, int]] = []
        self.refunds: list[tuple[str, int]] = []

    async def reserve(
        self, tenant: str, key: str, tokens: int, reservation_id: str
    ) -> auth_pb.ReserveTokensResponse:
        if self.down:
            raise DependencyUnavailable("auth")
        self.reserved.append((reservation_id, tokens))
        # As auth answers: limit 0 for an unlimited key, and enforced=False when it failed open.
        return auth_pb.ReserveTokensResponse(
            reservation_id=reservation_id, limit=100 if self.limited else 0, enforced=self.enforced
        )

    limited = True
    enforced = True

    async def refund(
        self, tenant: str, key: str, reservation_id: str, tokens: int, timeout_s: float
    ) -> None:
        self.refunds.append((reservation_id, tokens))


def admission(**kw: Any) -> Admission:
    base: dict[str, Any] = {
        "billing_id": "r1", "tenant_id": "acme", "key_id": "k1", "billing_key_id": "k1",
        "model": "m", "prompt_tokens": 10, "max_tokens": 100, "quota_tokens": 110,
        "billing_reserved": True, "admitted_at_s": 1_700_000_000.5,
    }  # fmt: skip
    base.update(kw)
    return Admission(**base)


@pytest.fixture
async def outbox(tmp_path: Path, clock: Any) -> Any:
    box = await Outbox.open(tmp_path / "outbox.sqlite3", synchronous="NORMAL", clock=clock)
    yield box
    await box.close()


def parts(
    outbox: Outbox,
) -> tuple[FakeBilling, FakeQuota, Settler, BillingSpool, CollectorRegistry]:
    registry = CollectorRegistry()
    metrics = RouterMetrics(registry)
    billing, quota = FakeBilling(), FakeQuota()
    spool = BillingSpool(outbox, billing, timeout_s=1.0, metrics=metrics)  # type: ignore[arg-type]
    settler = Settler(
        billing, quota, spool, timeout_s=1.0, metrics=metrics, background=Background()
    )  # type: ignore[arg-type]
    return billing, quota, settler, spool, registry


async def test_settles_produced_tokens_and_refunds_the_rest(outbox: Outbox) -> None:
    billing, quota, settler, _, _ = parts(outbox)
    await settler.settle(admission(), Outcome(10, 7, 4, STOP, produced=True))
    assert quota.refunds == [("r1", 110 - 17)]
    (request,) = billing.settled
    assert (request.prompt_tokens, request.completion_tokens, request.cached_tokens) == (10, 7, 4)
    # Complete enough for billing to record it even without a reservation.
    assert (request.tenant_id, request.key_id, request.model) == ("acme", "k1", "m")
    assert request.admitted_at.seconds == 1_700_000_000


async def test_nothing_produced_releases_or_does_nothing(outbox: Outbox) -> None:
    billing, quota, settler, _, _ = parts(outbox)
    nothing = Outcome(0, 0, 0, common_pb2.FINISH_REASON_UNSPECIFIED, produced=False)
    await settler.settle(admission(), nothing)
    assert billing.released == ["r1"]
    assert quota.refunds == [("r1", 110)]
    await settler.settle(
        admission(billing_id="r2", billing_reserved=False, quota_tokens=0), nothing
    )
    assert billing.released == ["r1"]
    assert billing.settled == []


async def test_billing_down_spools_durably_and_replays(outbox: Outbox, clock: Any) -> None:
    billing, _, settler, spool, registry = parts(outbox)
    billing.down = True
    await settler.settle(admission(), Outcome(10, 3, 0, STOP, produced=True))
    await settler.settle(admission(billing_id="r2"), Outcome(0, 0, 0, STOP, produced=False))
    assert await outbox.pending() == 2
    assert registry.get_sample_value("llm_router_settlements_total", {"outcome": "spooled"}) == 2
    # Still down: the replay keeps them.
    stats = await outbox.replay_once(spool.send)
    assert stats.retried == 1
    billing.down = False
    clock.advance(5.0)  # past the jittered backoff
    stats = await outbox.replay_once(spool.send)
    assert stats.delivered == 2
    assert [s.request_id for s in billing.settled] == ["r1"]
    assert billing.released == ["r2"]
    assert await outbox.pending() == 0


async def test_refused_settlements_are_dead_letters_not_retries(outbox: Outbox) -> None:
    billing, _, settler, spool, registry = parts(outbox)
    billing.refuse = True
    await settler.settle(admission(), Outcome(10, 3, 0, STOP, produced=True))
    assert registry.get_sample_value("llm_router_settlements_total", {"outcome": "failed"}) == 1
    key, payload = encode(billing_pb.SettleRequest(request_id="x"))
    await outbox.put(key, payload)
    (item,) = await outbox.due()
    assert await spool.send(item) is Delivery.REJECTED


def test_outbox_records_round_trip() -> None:
    settle = billing_pb.SettleRequest(request_id="a", prompt_tokens=3, tenant_id="t")
    release = billing_pb.ReleaseRequest(request_id="b", tenant_id="t")
    for request in (settle, release):
        key, payload = encode(request)
        assert request.request_id in key
        assert decode(payload) == request
    with pytest.raises(ValueError, match="unknown"):
        decode(b"Zjunk")


def test_billing_ids() -> None:
    caller = Caller("acme", "k1", frozenset())
    assert billing_id(caller, "", b"x") != billing_id(caller, "", b"x")  # fresh without a client id
    same = billing_id(caller, "req-1", b"body")
    assert same == billing_id(caller, "req-1", b"body")  # a retry is idempotent
    assert same != billing_id(caller, "req-1", b"other body")  # reuse for another request is not
    assert same != billing_id(Caller("other", "k1", frozenset()), "req-1", b"body")
    assert len(same) <= 128


async def test_admission_degrades_per_policy(outbox: Outbox) -> None:
    billing, quota, settler, _, _ = parts(outbox)
    metrics = RouterMetrics(CollectorRegistry())
    admitter = Admitter(quota, billing, settler, metrics, quota_fail_open=True)  # type: ignore[arg-type]
    caller = Caller("acme", "k1", frozenset())
    admit = {
        "request_id": "r9",
        "caller": caller,
        "model": "m",
        "prompt_tokens": 5,
        "max_tokens": 5,
    }
    held = await admitter.admit(**admit, policy=AdmissionPolicy())
    assert held.billing_reserved
    assert held.quota_tokens == 10
    quota.down, billing.down = True, True
    degraded = await admitter.admit(**admit, policy=AdmissionPolicy(billing_unavailable="admit"))
    assert not degraded.billing_reserved
    assert degraded.quota_tokens == 0
    with pytest.raises(DependencyUnavailable):
        await admitter.admit(**admit, policy=AdmissionPolicy(billing_unavailable="reject"))
    strict = Admitter(quota, billing, settler, metrics, quota_fail_open=False)  # type: ignore[arg-type]
    with pytest.raises(DependencyUnavailable):
        await strict.admit(**admit, policy=AdmissionPolicy())
    # An unlimited key holds nothing, so nothing is refunded later.
    quota.down, billing.down, quota.limited = False, False, False
    unlimited = await admitter.admit(**{**admit, "request_id": "r10"}, policy=AdmissionPolicy())
    assert unlimited.quota_tokens == 0
    assert unlimited.billing_reserved


async def small_admission(
    admitter: Admitter, request_id: str, model: str = "m", **policy: Any
) -> Admission:
    """Admit 5 + 5 tokens for acme/k1 under `policy`."""
    return await admitter.admit(
        request_id=request_id, caller=Caller("acme", "k1", frozenset()), model=model,
        prompt_tokens=5, max_tokens=5, policy=AdmissionPolicy(**policy),
    )  # fmt: skip


async def test_an_unlimited_key_skips_the_quota_until_the_memo_expires(outbox: Outbox) -> None:
    billing, quota, settler, _, _ = parts(outbox)
    metrics = RouterMetrics(CollectorRegistry())
    now = [0.0]
    memo = UnlimitedKeys(ttl_s=30.0, clock=lambda: now[0])
    admitter = Admitter(quota, billing, settler, metrics, quota_fail_open=True, unlimited=memo)  # type: ignore[arg-type]

    async def admit(request_id: str) -> int:
        return (await small_admission(admitter, request_id)).quota_tokens

    # A fail-open answer (auth's limiter down) says nothing about the key: not remembered.
    quota.limited, quota.enforced = False, False
    assert await admit("a1") == 0
    assert await admit("a2") == 0
    assert len(quota.reserved) == 2
    # Unlimited: the next requests within the TTL do not ask auth at all.
    quota.enforced = True
    assert await admit("a3") == 0
    assert await admit("a4") == 0
    assert await admit("a5") == 0
    assert len(quota.reserved) == 3
    assert metrics.quota_skipped._value.get() == 2
    # After the TTL a limit set meanwhile applies.
    now[0] = 31.0
    quota.limited = True
    assert await admit("a6") == 10
    assert len(quota.reserved) == 4


async def test_an_unbudgeted_caller_skips_reserve_and_settles_unreserved(outbox: Outbox) -> None:
    billing, quota, settler, _, _ = parts(outbox)
    metrics = RouterMetrics(CollectorRegistry())
    now = [0.0]
    memo = UnlimitedKeys(ttl_s=5.0, clock=lambda: now[0])
    admitter = Admitter(quota, billing, settler, metrics, quota_fail_open=True, unbudgeted=memo)  # type: ignore[arg-type]

    async def admit(request_id: str, model: str = "m", **policy: Any) -> bool:
        return (await small_admission(admitter, request_id, model, **policy)).billing_reserved

    assert await admit("b1")  # billing says budgeted (or is older): always reserve
    assert await admit("b2")
    billing.unbudgeted = True
    assert await admit("b3")  # reserved, and now remembered
    held = await small_admission(admitter, "b4")
    assert not held.billing_reserved
    assert [r.request_id for r in billing.reserved] == ["b1", "b2", "b3"]
    assert metrics.budget_skipped._value.get() == 1
    # Settled without a reservation: a complete Settle that records the usage.
    await settler.settle(held, Outcome(5, 3, 0, STOP, produced=True))
    settled = billing.settled[-1]
    assert (settled.request_id, settled.tenant_id, settled.model) == ("b4", "acme", "m")
    assert settled.admitted_at.seconds > 0
    # Memoised per model; and a tenant whose policy rejects without billing always reserves.
    assert await admit("b5", model="other")
    assert await admit("b6", billing_unavailable="reject")
    # After the TTL a budget set meanwhile applies.
    now[0] = 6.0
    billing.unbudgeted, billing.over_budget = False, True
    with pytest.raises(QuotaExceeded):
        await admit("b7")


def test_the_unlimited_memo_is_bounded() -> None:
    memo = UnlimitedKeys(ttl_s=30.0, max_entries=2)
    memo.remember("t", "a")
    memo.remember("t", "b")
    memo.remember("t", "c")  # full: emptied first
    assert ("t", "c") in memo
    assert ("t", "a") not in memo
    off = UnlimitedKeys(ttl_s=0.0)
    off.remember("t", "a")
    assert ("t", "a") not in off


async def test_refused_budget_gives_the_tokens_back(outbox: Outbox) -> None:
    billing, quota, settler, _, _ = parts(outbox)
    admitter = Admitter(
        quota, billing, settler, RouterMetrics(CollectorRegistry()), quota_fail_open=True
    )  # type: ignore[arg-type]
    billing.over_budget = True
    caller = Caller("acme", "k1", frozenset())
    with pytest.raises(QuotaExceeded):
        await admitter.admit(
            request_id="r5", caller=caller, model="m", prompt_tokens=5, max_tokens=5,
            policy=AdmissionPolicy(),
        )  # fmt: skip
    await settler._background.drain(1.0)
    assert quota.refunds == [("r5", 10)]
    assert billing.settled == []
    assert billing.released == []


def test_refusal_memo_expires_and_is_bounded(clock: Any) -> None:
    from llm_router.admission.admit import RefusalMemo

    memo = RefusalMemo(max_entries=2, max_s=30.0, clock=clock)
    a, b, c = (Caller(t, "k", frozenset()) for t in ("a", "b", "c"))
    memo.refused(a, 5.0)
    memo.refused(b, 1000.0)  # capped at 30 s
    assert memo.recent(a)
    assert memo.recent(b)
    assert not memo.recent(c)
    clock.advance(6)
    assert not memo.recent(a)
    assert memo.recent(b)
    memo.refused(c, None)
    memo.refused(a, 1.0)  # evicts the oldest entry (b)
    assert not memo.recent(b)
    assert memo.recent(c)


async def test_a_caller_that_leaves_during_admission_leaves_nothing_reserved(
    outbox: Outbox,
) -> None:
    import asyncio

    billing, quota, settler, _, _ = parts(outbox)
    gate = asyncio.Event()
    original = billing.reserve

    async def slow_reserve(request: billing_pb.ReserveRequest) -> Any:
        await gate.wait()
        return await original(request)

    billing.reserve = slow_reserve  # type: ignore[method-assign]
    admitter = Admitter(
        quota, billing, settler, RouterMetrics(CollectorRegistry()), quota_fail_open=True
    )  # type: ignore[arg-type]
    task = asyncio.ensure_future(
        admitter.admit(
            request_id="r7",
            caller=Caller("acme", "k1", frozenset()),
            model="m",
            prompt_tokens=5,
            max_tokens=5,
            policy=AdmissionPolicy(),
        )
    )
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    gate.set()  # the reservations complete after the caller left ...
    for _ in range(5):
        await asyncio.sleep(0)
    await settler._background.drain(1.0)
    # ... and are given back: quota refunded, budget reservation released.
    assert quota.refunds == [("r7", 10)]
    assert billing.released == ["r7"]
