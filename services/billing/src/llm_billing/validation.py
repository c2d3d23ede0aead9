"""Request validation: every field checked, all violations reported at once, sizes bounded."""

from __future__ import annotations

import re

from google.protobuf import timestamp_pb2

from llm_billing.budgets import MAX_LIMIT_MICROS, BudgetLimits
from llm_billing.config import Limits
from llm_billing.ledger_values import (
    Admission,
    BatchOp,
    ReleaseInput,
    ReserveInput,
    SettleInput,
    Usage,
)
from llm_billing.prices import MODEL_PATTERN
from llm_billing.timeutil import DAY_MS, Period
from llm_billing.usage import Granularity, UsageQuery
from llm_common.errors import FieldViolation, InvalidArgument, ServiceError
from llm_common.validation import Violations
from llmapi.billing.v1 import billing_service_pb2 as pb
from llmapi.common.v1 import common_pb2

# Identifiers become parts of Redis keys and CSV cells: no braces (hash tags), no `|` or `:`
# (counter and key separators), no leading sign characters (spreadsheet formulas).
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")
REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:~+/=-]{0,127}")
MAX_TIMESTAMP_S = 253_402_300_799  # 9999-12-31T23:59:59Z
MAX_BATCH_ITEMS = 256  # SettleBatch: bounds the pipeline and the reply size
_FINISH_REASONS = frozenset(common_pb2.FinishReason.values())
_GRANULARITIES = {
    pb.GRANULARITY_UNSPECIFIED: Granularity.TOTAL,
    pb.GRANULARITY_HOUR: Granularity.HOUR,
    pb.GRANULARITY_DAY: Granularity.DAY,
    pb.GRANULARITY_TOTAL: Granularity.TOTAL,
}
PERIODS = {
    pb.BUDGET_PERIOD_DAY: Period.DAY,
    pb.BUDGET_PERIOD_MONTH: Period.MONTH,
    pb.BUDGET_PERIOD_TOTAL: Period.TOTAL,
}


def reserve_input(req: pb.ReserveRequest, limits: Limits) -> ReserveInput:
    v = Violations()
    _request_id(v, req.request_id)
    _identifier(v, "tenant_id", req.tenant_id)
    _identifier(v, "key_id", req.key_id, optional=True)
    _model(v, "model", req.model)
    _tokens(v, "prompt_tokens", req.prompt_tokens, limits)
    _tokens(v, "max_completion_tokens", req.max_completion_tokens, limits)
    v.raise_if_any()
    return ReserveInput(
        request_id=req.request_id,
        tenant_id=req.tenant_id,
        key_id=req.key_id,
        model=req.model,
        prompt_tokens=req.prompt_tokens,
        max_completion_tokens=req.max_completion_tokens,
    )


def settle_input(req: pb.SettleRequest, limits: Limits) -> SettleInput:
    v = Violations()
    _request_id(v, req.request_id)
    _identifier(v, "tenant_id", req.tenant_id, optional=True)
    _identifier(v, "key_id", req.key_id, optional=True)
    if req.model:
        _model(v, "model", req.model)
        v.require(bool(req.tenant_id), "tenant_id", "is required when model is given")
    for name in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        _tokens(v, name, getattr(req, name), limits)
    v.require(req.cached_tokens <= req.prompt_tokens, "cached_tokens", "must be <= prompt_tokens")
    v.require(req.finish_reason in _FINISH_REASONS, "finish_reason", "is not a known FinishReason")
    admitted_at = _timestamp(v, "admitted_at", req.admitted_at, optional=True)
    v.raise_if_any()
    admission = None
    if req.model:
        admitted_ms = admitted_at if req.HasField("admitted_at") else None
        admission = Admission(key_id=req.key_id, model=req.model, admitted_at_ms=admitted_ms)
    usage = Usage(req.prompt_tokens, req.completion_tokens, req.cached_tokens, req.finish_reason)
    return SettleInput(req.request_id, req.tenant_id, usage, admission)


def release_input(req: pb.ReleaseRequest) -> tuple[str, str]:
    v = Violations()
    _request_id(v, req.request_id)
    _identifier(v, "tenant_id", req.tenant_id, optional=True)
    v.raise_if_any()
    return req.request_id, req.tenant_id


def batch_items(req: pb.SettleBatchRequest | pb.ReserveBatchRequest) -> None:
    """The envelope of a SettleBatch or ReserveBatch (its items are validated one by one)."""
    v = Violations()
    v.require(
        1 <= len(req.items) <= MAX_BATCH_ITEMS, "items", f"must hold 1-{MAX_BATCH_ITEMS} items"
    )
    v.raise_if_any()


def batch_op(item: pb.SettleBatchItem, limits: Limits) -> BatchOp | ServiceError:
    """One SettleBatch item as the unary call would validate it, or its InvalidArgument."""
    try:
        kind = item.WhichOneof("call")
        if kind == "settle":
            return settle_input(item.settle, limits)
        if kind == "release":
            return ReleaseInput(*release_input(item.release))
    except ServiceError as err:
        return err
    return InvalidArgument([FieldViolation("call", "one of settle or release is required")])


def batch_reserve(req: pb.ReserveRequest, limits: Limits) -> ReserveInput | ServiceError:
    """One ReserveBatch item as the unary Reserve would validate it, or its InvalidArgument."""
    try:
        return reserve_input(req, limits)
    except ServiceError as err:
        return err


def usage_query(req: pb.GetUsageRequest, limits: Limits) -> UsageQuery:
    v = Violations()
    _identifier(v, "tenant_id", req.tenant_id)
    _identifier(v, "key_id", req.key_id, optional=True)
    if req.model:
        _model(v, "model", req.model)
    v.require(req.granularity in _GRANULARITIES, "granularity", "is not a known Granularity")
    start, end = _range(v, req, limits)
    v.raise_if_any()
    return UsageQuery(
        tenant_id=req.tenant_id,
        key_id=req.key_id,
        model=req.model,
        start_ms=start,
        end_ms=end,
        granularity=_GRANULARITIES[req.granularity],
    )


def forget_tenant(req: pb.ForgetTenantRequest) -> str:
    v = Violations()
    _identifier(v, "tenant_id", req.tenant_id)
    v.raise_if_any()
    return req.tenant_id


def budget_scope(req: pb.GetBudgetRequest) -> tuple[str, str]:
    v = Violations()
    _identifier(v, "tenant_id", req.tenant_id)
    _identifier(v, "key_id", req.key_id, optional=True)
    v.raise_if_any()
    return req.tenant_id, req.key_id


def budget_limits(req: pb.SetBudgetRequest) -> BudgetLimits:
    v = Violations()
    b = req.budget
    v.require(req.HasField("budget"), "budget", "is required")
    _identifier(v, "budget.tenant_id", b.tenant_id)
    _identifier(v, "budget.key_id", b.key_id, optional=True)
    v.require(b.period in PERIODS, "budget.period", "must be DAY, MONTH or TOTAL")
    for name in ("hard_limit_micros", "soft_limit_micros"):
        value = getattr(b, name)
        v.require(
            0 <= value <= MAX_LIMIT_MICROS, f"budget.{name}", f"must be in 0..{MAX_LIMIT_MICROS}"
        )
    if b.hard_limit_micros and b.soft_limit_micros:
        v.require(
            b.soft_limit_micros <= b.hard_limit_micros,
            "budget.soft_limit_micros",
            "must be <= hard_limit_micros",
        )
    v.raise_if_any()
    return BudgetLimits(
        tenant_id=b.tenant_id,
        key_id=b.key_id,
        period=PERIODS[b.period],
        hard_limit_micros=b.hard_limit_micros,
        soft_limit_micros=b.soft_limit_micros,
    )


def export_range(req: pb.ExportUsageRequest, limits: Limits) -> tuple[str | None, int, int]:
    v = Violations()
    _identifier(v, "tenant_id", req.tenant_id, optional=True)
    start, end = _range(v, req, limits)
    v.raise_if_any()
    return (req.tenant_id or None), start, end


def invoice_ref(req: pb.CreateInvoiceRequest | pb.GetInvoiceRequest) -> tuple[str, str]:
    """Tenant and month (YYYY-MM) of CreateInvoice / GetInvoice."""
    v = Violations()
    _identifier(v, "tenant_id", req.tenant_id)
    if not re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", req.month):
        v.add("month", "must be YYYY-MM")
    v.raise_if_any()
    return req.tenant_id, req.month


def price_model(req: pb.ListPricesRequest) -> str | None:
    v = Violations()
    if req.model:
        _model(v, "model", req.model)
    v.raise_if_any()
    return req.model or None


def _request_id(v: Violations, value: str) -> None:
    v.require(
        REQUEST_ID_PATTERN.fullmatch(value) is not None,
        "request_id",
        "must be 1-128 characters [A-Za-z0-9._:~+/=-], starting with a letter or digit",
    )


def _identifier(v: Violations, field: str, value: str, *, optional: bool = False) -> None:
    if optional and not value:
        return
    v.require(
        ID_PATTERN.fullmatch(value) is not None,
        field,
        "must be 1-64 characters [A-Za-z0-9._@-], starting with a letter or digit",
    )


def _model(v: Violations, field: str, value: str) -> None:
    v.require(
        MODEL_PATTERN.fullmatch(value) is not None,
        field,
        "must be 1-128 characters [A-Za-z0-9._:/@-], starting with a letter or digit",
    )


def _tokens(v: Violations, field: str, value: int, limits: Limits) -> None:
    v.require(0 <= value <= limits.max_tokens, field, f"must be in 0..{limits.max_tokens}")


def _timestamp(
    v: Violations, field: str, ts: timestamp_pb2.Timestamp, *, optional: bool = False
) -> int:
    if optional and ts.seconds == 0 and ts.nanos == 0:
        return 0
    if not 0 <= ts.seconds <= MAX_TIMESTAMP_S or not 0 <= ts.nanos < 1_000_000_000:
        v.add(field, "must be a valid timestamp between 1970 and 9999")
        return 0
    return ts.seconds * 1000 + ts.nanos // 1_000_000


def _range(
    v: Violations, req: pb.GetUsageRequest | pb.ExportUsageRequest, limits: Limits
) -> tuple[int, int]:
    before = len(v)
    v.require(req.HasField("start_time"), "start_time", "is required")
    v.require(req.HasField("end_time"), "end_time", "is required")
    start_ms = _timestamp(v, "start_time", req.start_time)
    end_ms = _timestamp(v, "end_time", req.end_time)
    if len(v) > before:
        return start_ms, end_ms
    if not v.require(end_ms > start_ms, "end_time", "must be after start_time"):
        return start_ms, end_ms
    v.require(
        end_ms - start_ms <= limits.max_range_days * DAY_MS,
        "end_time",
        f"the range may span at most {limits.max_range_days} days",
    )
    return start_ms, end_ms
