"""Request validation: every violation reported, by field, before any ledger work."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from google.protobuf import timestamp_pb2

from llm_billing import validation
from llm_billing.config import Limits
from llm_billing.timeutil import Period
from llm_billing.usage import Granularity
from llm_common.errors import InvalidArgument
from llmapi.billing.v1 import billing_service_pb2 as pb

LIMITS = Limits(max_tokens=1000, max_range_days=31)
DAY_S = 86_400


def ts(seconds: int) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=seconds)


def fields_of(call: Callable[[], Any]) -> set[str]:
    with pytest.raises(InvalidArgument) as info:
        call()
    return {v.field for v in info.value.violations}


def test_valid_reserve() -> None:
    req = pb.ReserveRequest(
        request_id="req-1:a/b=",
        tenant_id="acme.inc",
        key_id="key_1",
        model="org/model-1",
        prompt_tokens=10,
        max_completion_tokens=1000,
    )
    r = validation.reserve_input(req, LIMITS)
    assert (r.request_id, r.tenant_id, r.key_id, r.model) == (
        "req-1:a/b=",
        "acme.inc",
        "key_1",
        "org/model-1",
    )
    assert validation.reserve_input(pb.ReserveRequest(**{**_reserve(), "key_id": ""}), LIMITS)


def _reserve() -> dict[str, Any]:
    return {"request_id": "r1", "tenant_id": "t", "key_id": "k", "model": "m"}


def test_every_reserve_violation_is_reported_at_once() -> None:
    req = pb.ReserveRequest(
        request_id="",
        tenant_id="{t}",
        key_id="a|b",
        model=" m",
        prompt_tokens=-1,
        max_completion_tokens=1001,
    )
    assert fields_of(lambda: validation.reserve_input(req, LIMITS)) == {
        "request_id",
        "tenant_id",
        "key_id",
        "model",
        "prompt_tokens",
        "max_completion_tokens",
    }


@pytest.mark.parametrize(
    "request_id", ["", "x" * 129, "=cmd", "-1", "a b", "a\n", "é", "a{b}", "a,b"]
)
def test_request_ids_that_could_break_keys_or_csv_are_refused(request_id: str) -> None:
    req = pb.ReserveRequest(**{**_reserve(), "request_id": request_id})
    assert fields_of(lambda: validation.reserve_input(req, LIMITS)) == {"request_id"}


@pytest.mark.parametrize("tenant", ["", "t" * 65, "a:b", "a|b", "{a}", "@a", "a b"])
def test_bad_tenant_ids(tenant: str) -> None:
    req = pb.ReserveRequest(**{**_reserve(), "tenant_id": tenant})
    assert fields_of(lambda: validation.reserve_input(req, LIMITS)) == {"tenant_id"}


def test_settle_checks_tokens_and_finish_reason() -> None:
    req = pb.SettleRequest(
        request_id="r1", prompt_tokens=5, completion_tokens=2000, cached_tokens=6, finish_reason=9
    )
    assert fields_of(lambda: validation.settle_input(req, LIMITS)) == {
        "completion_tokens",
        "cached_tokens",
        "finish_reason",
    }


def test_settle_without_reservation_needs_the_tenant() -> None:
    req = pb.SettleRequest(request_id="r1", model="m")
    assert fields_of(lambda: validation.settle_input(req, LIMITS)) == {"tenant_id"}


def test_settle_admission_fields() -> None:
    plain = validation.settle_input(pb.SettleRequest(request_id="r1", tenant_id="t"), LIMITS)
    assert plain.admission is None
    req = pb.SettleRequest(
        request_id="r1", tenant_id="t", key_id="k", model="m", admitted_at=ts(1_700_000_000)
    )
    admitted = validation.settle_input(req, LIMITS).admission
    assert admitted is not None
    assert (admitted.key_id, admitted.model, admitted.admitted_at_ms) == (
        "k",
        "m",
        1_700_000_000_000,
    )
    now = validation.settle_input(
        pb.SettleRequest(request_id="r", tenant_id="t", model="m"), LIMITS
    )
    assert now.admission is not None
    assert now.admission.admitted_at_ms is None


def test_usage_query_range_rules() -> None:
    ok = pb.GetUsageRequest(tenant_id="t", start_time=ts(0), end_time=ts(DAY_S))
    query = validation.usage_query(ok, LIMITS)
    assert query.granularity is Granularity.TOTAL
    assert (query.start_ms, query.end_ms) == (0, DAY_S * 1000)
    missing = pb.GetUsageRequest(tenant_id="t")
    assert fields_of(lambda: validation.usage_query(missing, LIMITS)) == {"start_time", "end_time"}
    backwards = pb.GetUsageRequest(tenant_id="t", start_time=ts(10), end_time=ts(5))
    assert fields_of(lambda: validation.usage_query(backwards, LIMITS)) == {"end_time"}
    too_long = pb.GetUsageRequest(tenant_id="t", start_time=ts(0), end_time=ts(32 * DAY_S))
    assert fields_of(lambda: validation.usage_query(too_long, LIMITS)) == {"end_time"}
    odd = pb.GetUsageRequest(
        tenant_id="t",
        start_time=timestamp_pb2.Timestamp(seconds=-5),
        end_time=ts(1),
        granularity=7,  # type: ignore[arg-type]
        model="bad model",
    )
    assert fields_of(lambda: validation.usage_query(odd, LIMITS)) == {
        "start_time",
        "granularity",
        "model",
    }


def test_budget_rules() -> None:
    good = pb.SetBudgetRequest(
        budget=pb.Budget(
            tenant_id="t",
            period=pb.BUDGET_PERIOD_MONTH,
            hard_limit_micros=100,
            soft_limit_micros=80,
        )
    )
    limits = validation.budget_limits(good)
    assert limits.period is Period.MONTH
    assert (limits.hard_limit_micros, limits.soft_limit_micros) == (100, 80)
    assert fields_of(lambda: validation.budget_limits(pb.SetBudgetRequest())) == {
        "budget",
        "budget.tenant_id",
        "budget.period",
    }
    bad = pb.SetBudgetRequest(
        budget=pb.Budget(
            tenant_id="t",
            period=pb.BUDGET_PERIOD_DAY,
            hard_limit_micros=10,
            soft_limit_micros=20,
        )
    )
    assert fields_of(lambda: validation.budget_limits(bad)) == {"budget.soft_limit_micros"}
    huge = pb.SetBudgetRequest(
        budget=pb.Budget(tenant_id="t", period=pb.BUDGET_PERIOD_DAY, hard_limit_micros=10**16)
    )
    assert fields_of(lambda: validation.budget_limits(huge)) == {"budget.hard_limit_micros"}


def test_export_and_prices_requests() -> None:
    tenant, start, end = validation.export_range(
        pb.ExportUsageRequest(start_time=ts(0), end_time=ts(60)), LIMITS
    )
    assert (tenant, start, end) == (None, 0, 60_000)
    assert fields_of(
        lambda: validation.export_range(pb.ExportUsageRequest(tenant_id="a:b"), LIMITS)
    ) == {"tenant_id", "start_time", "end_time"}
    assert validation.price_model(pb.ListPricesRequest()) is None
    assert fields_of(lambda: validation.price_model(pb.ListPricesRequest(model="a b"))) == {"model"}
