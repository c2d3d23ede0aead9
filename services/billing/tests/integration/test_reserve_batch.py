"""ReserveBatch over a real grpc.aio server on port 0 and the real Redis: each item gets the
unary Reserve's outcome (details included), repeats change nothing, concurrent batches never
exceed a hard budget, and a Redis outage is each item's UNAVAILABLE."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

from llm_billing.metrics import BillingMetrics
from llm_billing.validation import MAX_BATCH_ITEMS
from llm_common.errors import parse_error
from llmapi.billing.v1 import billing_service_pb2 as pb
from llmapi.billing.v1 import billing_service_pb2_grpc as pb_grpc

from .test_server import reserve

pytestmark = pytest.mark.integration

if TYPE_CHECKING:
    Stub = pb_grpc.BillingServiceAsyncStub
CODES = {c.value[0]: c.name for c in grpc.StatusCode}


async def batch(stub: Stub, *items: pb.ReserveRequest) -> list[pb.ReserveBatchResult]:
    return list((await stub.ReserveBatch(pb.ReserveBatchRequest(items=items))).results)


def codes(results: list[pb.ReserveBatchResult]) -> list[str]:
    return [CODES[r.status.code] for r in results]


def details(result: pb.ReserveBatchResult) -> list[Any]:
    """The google.rpc details of an item, read as a google.rpc.Status (same wire format)."""
    status = status_pb2.Status.FromString(result.status.SerializeToString())
    found: list[Any] = []
    for detail in status.details:
        for kind in (
            error_details_pb2.BadRequest,
            error_details_pb2.QuotaFailure,
            error_details_pb2.RetryInfo,
        ):
            message = kind()
            if detail.Unpack(message):
                found.append(message)
    return found


async def set_budget(
    stub: Stub, hard_limit_micros: int, period: int = pb.BUDGET_PERIOD_TOTAL, key_id: str = ""
) -> None:
    budget = pb.Budget(
        tenant_id="acme", key_id=key_id, period=period, hard_limit_micros=hard_limit_micros
    )
    await stub.SetBudget(pb.SetBudgetRequest(budget=budget))


async def test_mixed_batch_gives_each_item_the_unary_outcome(
    stub: Stub, reserve_of: Any, metrics: BillingMetrics
) -> None:
    await stub.Reserve(reserve("taken", tenant_id="globex"))
    results = await batch(
        stub,
        reserve("a"),  # held
        reserve("bad id!"),  # invalid request id
        reserve("a"),  # the same request again, in the same batch
        reserve("m", model="no-such-model"),  # no price: NOT_FOUND
        reserve("taken"),  # another tenant's request id: ALREADY_EXISTS
        reserve("z", prompt_tokens=-1, max_completion_tokens=-5),  # two violations
    )

    assert codes(results) == ["OK", "INVALID_ARGUMENT", "OK", "NOT_FOUND", "ALREADY_EXISTS",
                              "INVALID_ARGUMENT"]  # fmt: skip
    held = [results[0].reservation, results[2].reservation]
    assert sorted(r.duplicate for r in held) == [False, True]
    assert {r.reserved_micros for r in held} == {reserve_of("small", 1000, 500)}
    assert results[0].reservation.expires_at.seconds > 0
    assert [v.field for v in details(results[1])[0].field_violations] == ["request_id"]
    assert [v.field for v in details(results[5])[0].field_violations] == [
        "prompt_tokens",
        "max_completion_tokens",
    ]
    assert not results[1].HasField("reservation")
    assert metrics.reservations.labels("held")._value.get() == 2  # "taken" and "a"
    assert metrics.reservations.labels("duplicate")._value.get() == 1
    assert metrics.batch_items.labels("reserve", "OK")._value.get() == 2
    assert metrics.batch_items.labels("reserve", "INVALID_ARGUMENT")._value.get() == 2


async def test_refused_item_has_the_unary_quota_failure_and_retry_info(stub: Stub) -> None:
    await set_budget(stub, 1000, pb.BUDGET_PERIOD_DAY, key_id="k1")  # resets: RetryInfo
    results = await batch(stub, reserve("r1"), reserve("r2"), reserve("r3"))
    with pytest.raises(grpc.aio.AioRpcError) as unary:
        await stub.Reserve(reserve("r4"))
    expected = parse_error(unary.value)

    assert codes(results) == ["OK", "OK", "RESOURCE_EXHAUSTED"]
    refused = results[2].status
    assert (refused.code, refused.message) == (expected.code.value[0], expected.message)
    quota, retry = details(results[2])
    assert [v.subject for v in quota.violations] == [v.subject for v in expected.quota_violations]
    assert expected.retry_after_s is not None
    assert retry.retry_delay.seconds == pytest.approx(expected.retry_after_s, abs=1)


async def test_same_batch_twice_changes_nothing(stub: Stub) -> None:
    await set_budget(stub, 10**9)
    items = [reserve(f"r{i}", prompt_tokens=100 * i) for i in range(1, 9)]
    budget_request = pb.GetBudgetRequest(tenant_id="acme")

    first = await batch(stub, *items)
    budget = await stub.GetBudget(budget_request)
    again = await batch(stub, *items)

    assert codes(first) == codes(again) == ["OK"] * 8
    assert [r.reservation.duplicate for r in first] == [False] * 8
    assert [r.reservation.duplicate for r in again] == [True] * 8
    assert [r.reservation.reserved_micros for r in again] == [
        r.reservation.reserved_micros for r in first
    ]
    assert budget.budget.reserved_micros == sum(r.reservation.reserved_micros for r in first)
    assert await stub.GetBudget(budget_request) == budget


async def test_concurrent_batches_never_exceed_a_hard_budget(stub: Stub, reserve_of: Any) -> None:
    each = reserve_of("small", 1000, 500)
    fits = 25
    await set_budget(stub, fits * each + each // 2)
    batches = [[reserve(f"b{b}-{i}") for i in range(10)] for b in range(8)]  # 80 asked

    replies = await asyncio.gather(*(batch(stub, *items) for items in batches))

    outcomes = [code for reply in replies for code in codes(reply)]
    assert outcomes.count("OK") == fits
    assert outcomes.count("RESOURCE_EXHAUSTED") == 80 - fits
    budget = (await stub.GetBudget(pb.GetBudgetRequest(tenant_id="acme"))).budget
    assert budget.reserved_micros == fits * each <= budget.hard_limit_micros


@pytest.mark.parametrize("count", [0, MAX_BATCH_ITEMS + 1])
async def test_envelope_out_of_bounds_is_invalid_argument(stub: Stub, count: int) -> None:
    request = pb.ReserveBatchRequest(items=[reserve(f"r{i}") for i in range(count)])
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ReserveBatch(request)
    err = parse_error(info.value)
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in err.field_violations] == ["items"]


async def test_full_batch_is_accepted(stub: Stub) -> None:
    results = await batch(stub, *(reserve(f"r{i}") for i in range(MAX_BATCH_ITEMS)))
    assert codes(results) == ["OK"] * MAX_BATCH_ITEMS


async def test_redis_outage_is_each_items_unavailable_then_recovers(
    on_private_redis: tuple[Any, pb_grpc.BillingServiceAsyncStub],
) -> None:
    store, stub = on_private_redis
    request = pb.ReserveBatchRequest(items=[reserve("r1"), reserve("bad id!")])
    store.kill()
    reply = await stub.ReserveBatch(request, timeout=10)
    assert codes(list(reply.results)) == ["UNAVAILABLE", "INVALID_ARGUMENT"]
    (retry,) = details(reply.results[0])
    assert retry.retry_delay.seconds == 1
    store.start()
    reply = await stub.ReserveBatch(request, timeout=10)
    assert codes(list(reply.results)) == ["OK", "INVALID_ARGUMENT"]
    assert not reply.results[0].reservation.duplicate
