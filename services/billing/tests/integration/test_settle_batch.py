"""SettleBatch over a real grpc.aio server on port 0 and the real Redis: per-item statuses,
idempotency, the envelope, and the ledger against an independent sum."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import timestamp_pb2
from google.rpc import error_details_pb2, status_pb2

from llm_billing.metrics import BillingMetrics
from llm_billing.validation import MAX_BATCH_ITEMS
from llm_common.errors import ErrorDetails, parse_error
from llmapi.billing.v1 import billing_service_pb2 as pb
from llmapi.billing.v1 import billing_service_pb2_grpc as pb_grpc
from llmapi.common.v1 import common_pb2

pytestmark = pytest.mark.integration

if TYPE_CHECKING:
    Stub = pb_grpc.BillingServiceAsyncStub
STOP = common_pb2.FINISH_REASON_STOP
OK = grpc.StatusCode.OK.value[0]
HOUR_S = 3600


def usage_query(tenant: str) -> pb.GetUsageRequest:
    now = int(time.time())
    return pb.GetUsageRequest(
        tenant_id=tenant,
        start_time=timestamp_pb2.Timestamp(seconds=now - 2 * HOUR_S),
        end_time=timestamp_pb2.Timestamp(seconds=now + 2 * HOUR_S),
    )


def reserve(rid: str, tenant: str = "acme", model: str = "small") -> pb.ReserveRequest:
    return pb.ReserveRequest(
        request_id=rid,
        tenant_id=tenant,
        key_id="k1",
        model=model,
        prompt_tokens=1000,
        max_completion_tokens=500,
    )


def settle(rid: str, **fields: Any) -> pb.SettleBatchItem:
    values: dict[str, Any] = {
        "tenant_id": "acme",
        "prompt_tokens": 1000,
        "completion_tokens": 200,
        "finish_reason": STOP,
    }
    return pb.SettleBatchItem(settle=pb.SettleRequest(request_id=rid, **{**values, **fields}))


def release(rid: str, tenant: str = "acme") -> pb.SettleBatchItem:
    return pb.SettleBatchItem(release=pb.ReleaseRequest(request_id=rid, tenant_id=tenant))


def code_of(result: pb.SettleBatchResult) -> grpc.StatusCode:
    return next(c for c in grpc.StatusCode if c.value[0] == result.status.code)


def field_violations(result: pb.SettleBatchResult) -> list[str]:
    """The BadRequest fields of an item, read as a google.rpc.Status (same wire format)."""
    status = status_pb2.Status.FromString(result.status.SerializeToString())
    fields = []
    for detail in status.details:
        bad_request = error_details_pb2.BadRequest()
        if detail.Unpack(bad_request):
            fields += [v.field for v in bad_request.field_violations]
    return fields


async def set_budget(stub: Stub, tenant: str) -> None:
    budget = pb.Budget(tenant_id=tenant, period=pb.BUDGET_PERIOD_TOTAL, hard_limit_micros=10**12)
    await stub.SetBudget(pb.SetBudgetRequest(budget=budget))


async def failure(call: Any) -> ErrorDetails:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return parse_error(info.value)


async def test_mixed_batch_gives_each_item_the_unary_outcome(
    stub: Stub, cost_of: Callable[..., int], metrics: BillingMetrics
) -> None:
    for rid in ("a", "b", "c", "no-tenant"):
        await stub.Reserve(reserve(rid))
    long_ago = timestamp_pb2.Timestamp(seconds=int(time.time()) - 400 * 86_400)
    items = [
        settle("a", cached_tokens=400),  # ok
        settle("bad id!"),  # invalid request id
        settle("a"),  # duplicate of the first, in the same batch
        settle("ghost"),  # no reservation, no model: NOT_FOUND
        release("b"),  # released
        pb.SettleBatchItem(),  # neither settle nor release
        settle("late", model="small", admitted_at=long_ago),  # older than retention
        settle("unres", model="small", key_id="k2"),  # recorded without a reservation
        release("never"),  # nothing to release: OK, released=False
        settle("no-tenant", tenant_id=""),  # tenant looked up by request id
        settle("c", cached_tokens=2000),  # cached > prompt
    ]
    reply = await stub.SettleBatch(pb.SettleBatchRequest(items=items))

    codes = [code_of(r).name for r in reply.results]
    assert codes == [
        "OK",
        "INVALID_ARGUMENT",
        "OK",
        "NOT_FOUND",
        "OK",
        "INVALID_ARGUMENT",
        "FAILED_PRECONDITION",
        "OK",
        "OK",
        "OK",
        "INVALID_ARGUMENT",
    ]
    first, dup = reply.results[0].settle, reply.results[2].settle
    assert (first.request_id, first.duplicate) == ("a", False)
    assert first.charged_micros == cost_of("small", 1000, 200, 400)
    assert (dup.duplicate, dup.charged_micros) == (True, first.charged_micros)
    assert field_violations(reply.results[1]) == ["request_id"]
    assert field_violations(reply.results[5]) == ["call"]
    assert field_violations(reply.results[10]) == ["cached_tokens"]
    assert reply.results[1].WhichOneof("response") is None
    assert reply.results[4].release.released
    assert reply.results[7].settle.unreserved
    assert not reply.results[8].release.released
    assert reply.results[9].settle.charged_micros == cost_of("small", 1000, 200)

    # c was refused, so it is still open: the unary Settle settles it now.
    assert not (await stub.Settle(settle("c").settle)).duplicate
    assert metrics.settlements.labels("settled")._value.get() == 3  # a, no-tenant, c
    assert metrics.settlements.labels("duplicate")._value.get() == 1
    assert metrics.settlements.labels("unreserved")._value.get() == 1
    assert metrics.releases.labels("released")._value.get() == 1
    assert metrics.releases.labels("noop")._value.get() == 1
    assert metrics.batch_items.labels("settle", "INVALID_ARGUMENT")._value.get() == 2
    assert metrics.batch_items.labels("none", "INVALID_ARGUMENT")._value.get() == 1
    assert metrics.batch_items.labels("settle", "OK")._value.get() == 4


async def test_item_errors_match_the_unary_call(stub: Stub) -> None:
    bad = pb.SettleRequest(request_id="x", prompt_tokens=-1, finish_reason=STOP)
    unary = await failure(stub.Settle(bad))
    reply = await stub.SettleBatch(pb.SettleBatchRequest(items=[pb.SettleBatchItem(settle=bad)]))
    (result,) = reply.results
    assert result.status.code == unary.code.value[0]
    assert result.status.message == unary.message
    assert field_violations(result) == [v.field for v in unary.field_violations]


async def test_same_batch_twice_changes_nothing(stub: Stub) -> None:
    await set_budget(stub, "acme")
    rids = [f"r{i}" for i in range(10)]
    for rid in rids:
        await stub.Reserve(reserve(rid))
    items = [settle(rid, completion_tokens=i * 10) for i, rid in enumerate(rids[:8])]
    items += [release(rid) for rid in rids[8:]]
    request = pb.SettleBatchRequest(items=items)
    usage_request = usage_query("acme")
    budget_request = pb.GetBudgetRequest(tenant_id="acme")

    first = await stub.SettleBatch(request)
    usage, budget = await stub.GetUsage(usage_request), await stub.GetBudget(budget_request)
    again = await stub.SettleBatch(request)

    assert all(r.status.code == OK for r in [*first.results, *again.results])
    assert [r.settle.duplicate for r in first.results[:8]] == [False] * 8
    assert [r.settle.duplicate for r in again.results[:8]] == [True] * 8
    assert [r.settle.charged_micros for r in again.results] == [
        r.settle.charged_micros for r in first.results
    ]
    assert [r.release.released for r in first.results[8:]] == [True, True]
    assert [r.release.released for r in again.results[8:]] == [False, False]
    assert await stub.GetUsage(usage_request) == usage
    assert await stub.GetBudget(budget_request) == budget
    assert budget.budget.reserved_micros == 0


@pytest.mark.parametrize("count", [0, MAX_BATCH_ITEMS + 1])
async def test_envelope_out_of_bounds_is_invalid_argument(stub: Stub, count: int) -> None:
    request = pb.SettleBatchRequest(items=[settle(f"r{i}") for i in range(count)])
    err = await failure(stub.SettleBatch(request))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in err.field_violations] == ["items"]


async def test_full_batch_is_accepted(stub: Stub) -> None:
    request = pb.SettleBatchRequest(items=[release(f"r{i}") for i in range(MAX_BATCH_ITEMS)])
    reply = await stub.SettleBatch(request)
    assert len(reply.results) == MAX_BATCH_ITEMS
    assert not any(r.release.released for r in reply.results)


async def test_ledger_equals_an_independent_sum(stub: Stub, cost_of: Callable[..., int]) -> None:
    rng = random.Random(6)
    tenants, models = ("acme", "globex"), ("small", "odd", "big")
    expected = {tenant: [0, 0] for tenant in tenants}  # requests, cost
    items = []
    for tenant in tenants:
        await set_budget(stub, tenant)
    for i in range(120):
        tenant, model = rng.choice(tenants), rng.choice(models)
        await stub.Reserve(reserve(f"q{i}", tenant, model))
        prompt, completion = rng.randint(0, 1000), rng.randint(0, 500)
        cached = rng.randint(0, prompt)
        items.append(
            settle(
                f"q{i}",
                tenant_id=tenant if i % 3 else "",  # every third looked up by request id
                prompt_tokens=prompt,
                completion_tokens=completion,
                cached_tokens=cached,
            )
        )
        expected[tenant][0] += 1
        expected[tenant][1] += cost_of(model, prompt, completion, cached)
    reply = await stub.SettleBatch(pb.SettleBatchRequest(items=items))
    assert all(r.status.code == OK for r in reply.results)
    for tenant in tenants:
        usage = await stub.GetUsage(usage_query(tenant))
        budget = await stub.GetBudget(pb.GetBudgetRequest(tenant_id=tenant))
        assert [usage.total.requests, usage.total.cost_micros] == expected[tenant]
        assert (budget.budget.spent_micros, budget.budget.reserved_micros) == (
            expected[tenant][1],
            0,
        )


async def test_redis_outage_fails_the_whole_batch_as_unavailable(
    on_private_redis: tuple[Any, pb_grpc.BillingServiceAsyncStub],
) -> None:
    store, stub = on_private_redis
    await stub.Reserve(reserve("r1"))
    request = pb.SettleBatchRequest(items=[settle("r1"), settle("bad id!")])
    store.kill()
    err = await failure(stub.SettleBatch(request, timeout=10))
    assert err.code == grpc.StatusCode.UNAVAILABLE
    assert err.retry_after_s == 1.0
    store.start()  # an empty Redis: reserve again
    await stub.Reserve(reserve("r1"), timeout=10)
    reply = await stub.SettleBatch(request, timeout=10)
    assert [code_of(r).name for r in reply.results] == ["OK", "INVALID_ARGUMENT"]
    assert not reply.results[0].settle.duplicate
