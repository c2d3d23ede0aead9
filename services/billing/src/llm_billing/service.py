"""BillingServicer: validate, call the ledger, build the response (no logic of its own)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
from google.protobuf import timestamp_pb2
from prometheus_client import Counter

from llm_billing import validation
from llm_billing.budgets import Budgets, BudgetStatus
from llm_billing.config import Limits
from llm_billing.erasure import TenantEraser
from llm_billing.invoice import InvoiceExporter
from llm_billing.invoicing import Invoice
from llm_billing.ledger import Ledger
from llm_billing.ledger_values import BatchOutcome, Reservation, ReserveInput, Settlement
from llm_billing.metrics import BillingMetrics
from llm_billing.prices import Price
from llm_billing.store import now_ms, store_errors
from llm_billing.usage import UsageReader, UsageTotals
from llm_billing.usage_store import UsageStoreParts, database_errors
from llm_common.audit import AuditLog, audited
from llm_common.errors import FailedPrecondition, Internal, QuotaExceeded, ServiceError
from llm_common.logging import get_logger
from llmapi.billing.v1 import billing_service_pb2 as pb
from llmapi.billing.v1 import billing_service_pb2_grpc as pb_grpc

Context = grpc.aio.ServicerContext[Any, Any]
_PERIODS = {period: number for number, period in validation.PERIODS.items()}
RESERVE_OUTCOMES = ("held", "duplicate", "soft_limit", "rejected")
SETTLE_OUTCOMES = ("settled", "duplicate", "corrected", "unreserved")
_CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
_log = get_logger(__name__)


class BillingServicer(pb_grpc.BillingServiceServicer):
    """llmapi.billing.v1.BillingService over the Redis ledger."""

    def __init__(
        self,
        ledger: Ledger,
        budgets: Budgets,
        usage: UsageReader,
        invoices: InvoiceExporter,
        limits: Limits,
        metrics: BillingMetrics,
        *,
        usage_store: UsageStoreParts | None = None,
        audit: AuditLog | None = None,
        eraser: TenantEraser | None = None,
    ) -> None:
        self._audit = audit or AuditLog()
        self._eraser = eraser
        self._ledger = ledger
        self._store = usage_store
        self._budgets = budgets
        self._usage = usage
        self._invoices = invoices
        self._limits = limits
        self._metrics = metrics
        # Label children resolved once: labels() takes a lock and hashes on every call.
        self._reserved = _children(metrics.reservations, RESERVE_OUTCOMES)
        self._settled = _children(metrics.settlements, SETTLE_OUTCOMES)
        self._charged = metrics.charged.labels(ledger.prices.currency)

    # Method names are the contract's RPC names, hence the noqa N802.
    async def Reserve(  # noqa: N802
        self, request: pb.ReserveRequest, context: Context
    ) -> pb.ReserveResponse:
        return await self._reserve(validation.reserve_input(request, self._limits))

    async def Settle(  # noqa: N802
        self, request: pb.SettleRequest, context: Context
    ) -> pb.SettleResponse:
        settle = validation.settle_input(request, self._limits)
        async with store_errors():
            settlement = await self._ledger.settle(settle)
        self._count_settlement(settlement)
        return _settle_response(settlement)

    async def Release(  # noqa: N802
        self, request: pb.ReleaseRequest, context: Context
    ) -> pb.ReleaseResponse:
        request_id, tenant_id = validation.release_input(request)
        async with store_errors():
            released = await self._ledger.release(request_id, tenant_id)
        self._metrics.releases.labels("released" if released else "noop").inc()
        return pb.ReleaseResponse(released=released)

    async def SettleBatch(  # noqa: N802
        self, request: pb.SettleBatchRequest, context: Context
    ) -> pb.SettleBatchResponse:
        validation.batch_items(request)
        parsed = [validation.batch_op(item, self._limits) for item in request.items]
        ops = [p for p in parsed if not isinstance(p, ServiceError)]
        async with store_errors():
            outcomes = iter(await self._ledger.apply_many(ops) if ops else [])
        results = [
            self._batch_result(p if isinstance(p, ServiceError) else next(outcomes), item)
            for p, item in zip(parsed, request.items, strict=True)
        ]
        return pb.SettleBatchResponse(results=results)

    def _batch_result(
        self, outcome: BatchOutcome, item: pb.SettleBatchItem
    ) -> pb.SettleBatchResult:
        """One item's result, counted in the same metrics as the unary call."""
        call = item.WhichOneof("call") or "none"
        if isinstance(outcome, Settlement):
            self._count_settlement(outcome)
            result = pb.SettleBatchResult(settle=_settle_response(outcome))
        elif isinstance(outcome, bool):
            self._metrics.releases.labels("released" if outcome else "noop").inc()
            result = pb.SettleBatchResult(release=pb.ReleaseResponse(released=outcome))
        else:
            result = pb.SettleBatchResult(status=_item_status(outcome, call))
        self._metrics.batch_items.labels(call, _code_name(result.status.code)).inc()
        return result

    async def ReserveBatch(  # noqa: N802
        self, request: pb.ReserveBatchRequest, context: Context
    ) -> pb.ReserveBatchResponse:
        validation.batch_items(request)
        parsed = [validation.batch_reserve(item, self._limits) for item in request.items]
        # Concurrently: the Redis link sends the items' commands in one pipeline.
        outcomes = await asyncio.gather(*(self._reserve_item(p) for p in parsed))
        return pb.ReserveBatchResponse(results=outcomes)

    async def _reserve_item(self, item: ReserveInput | ServiceError) -> pb.ReserveBatchResult:
        """One item's result, counted in the same metrics as the unary call."""
        if isinstance(item, ServiceError):
            result = pb.ReserveBatchResult(status=_item_status(item, "reserve"))
        else:
            try:
                result = pb.ReserveBatchResult(reservation=await self._reserve(item))
            except Exception as err:  # each item gets its own status
                result = pb.ReserveBatchResult(status=_item_status(err, "reserve"))
        self._metrics.batch_items.labels("reserve", _code_name(result.status.code)).inc()
        return result

    async def _reserve(self, reserve: ReserveInput) -> pb.ReserveResponse:
        try:
            async with store_errors():
                reservation = await self._ledger.reserve(reserve)
        except QuotaExceeded:
            self._reserved["rejected"].inc()
            raise
        self._count_reservation(reservation)
        return _reserve_response(reservation)

    async def GetUsage(  # noqa: N802
        self, request: pb.GetUsageRequest, context: Context
    ) -> pb.GetUsageResponse:
        query = validation.usage_query(request, self._limits)
        if self._store is not None and self._store.reads_store(query.start_ms):
            report = await self._store.usage(query)
        else:
            async with store_errors():
                report = await self._usage.usage(query)
        return pb.GetUsageResponse(
            buckets=[_bucket(b.start_ms, b.totals) for b in report.buckets],
            total=_bucket(query.start_ms, report.total),
            currency=self._ledger.prices.currency,
        )

    async def GetBudget(  # noqa: N802
        self, request: pb.GetBudgetRequest, context: Context
    ) -> pb.GetBudgetResponse:
        tenant_id, key_id = validation.budget_scope(request)
        async with store_errors():
            status = await self._budgets.get(tenant_id, key_id)
        return pb.GetBudgetResponse(budget=_budget(status))

    async def SetBudget(  # noqa: N802
        self, request: pb.SetBudgetRequest, context: Context
    ) -> pb.SetBudgetResponse:
        limits = validation.budget_limits(request)
        target = f"budget:{limits.tenant_id}/{limits.key_id or '*'}"
        details = {
            "period": limits.period.value,
            "hard_limit_micros": str(limits.hard_limit_micros),
            "soft_limit_micros": str(limits.soft_limit_micros),
        }
        with audited(self._audit, context, "budget.set", target, details):
            async with store_errors():
                status = await self._budgets.set(limits)
        return pb.SetBudgetResponse(budget=_budget(status))

    async def ForgetTenant(  # noqa: N802
        self, request: pb.ForgetTenantRequest, context: Context
    ) -> pb.ForgetTenantResponse:
        """Admin only (the edge admits admins of the admin tenant, as for SetBudget)."""
        tenant_id = validation.forget_tenant(request)
        if self._eraser is None:
            raise FailedPrecondition("tenant erasure is not configured on this billing server")
        with audited(self._audit, context, "tenant.forget", f"tenant:{tenant_id}"):
            async with store_errors(), database_errors():
                erased = await self._eraser.forget(tenant_id)
        return pb.ForgetTenantResponse(
            ledger_records_deleted=erased.ledger_records, usage_rows_deleted=erased.usage_rows
        )

    async def ExportUsage(  # noqa: N802
        self, request: pb.ExportUsageRequest, context: Context
    ) -> AsyncIterator[pb.ExportUsageResponse]:
        tenant_id, start_ms, end_ms = validation.export_range(request, self._limits)
        if self._store is not None and self._store.reads_store(start_ms):
            async for line in self._store.export(tenant_id, start_ms, end_ms):
                yield pb.ExportUsageResponse(line=line)
            return
        async with store_errors():
            async for line in self._invoices.lines(tenant_id, start_ms, end_ms):
                yield pb.ExportUsageResponse(line=line)

    async def ListPrices(  # noqa: N802
        self, request: pb.ListPricesRequest, context: Context
    ) -> pb.ListPricesResponse:
        model = validation.price_model(request)
        prices = self._ledger.prices.current_and_scheduled(now_ms(), model)
        return pb.ListPricesResponse(prices=[_price(p) for p in prices])

    async def CreateInvoice(  # noqa: N802
        self, request: pb.CreateInvoiceRequest, context: Context
    ) -> pb.CreateInvoiceResponse:
        tenant_id, month = validation.invoice_ref(request)
        parts = self._require_store()
        async with store_errors(), database_errors():
            invoice, created = await parts.invoicing.create(tenant_id, month)
        return pb.CreateInvoiceResponse(invoice=invoice_pb(invoice), created=created)

    async def GetInvoice(  # noqa: N802
        self, request: pb.GetInvoiceRequest, context: Context
    ) -> pb.GetInvoiceResponse:
        tenant_id, month = validation.invoice_ref(request)
        parts = self._require_store()
        async with database_errors():
            invoice = await parts.invoicing.get(tenant_id, month)
        return pb.GetInvoiceResponse(invoice=invoice_pb(invoice))

    def _require_store(self) -> UsageStoreParts:
        if self._store is None:
            raise FailedPrecondition("billing runs without a usage store (BILLING_DATABASE_URL)")
        return self._store

    def _count_reservation(self, reservation: Reservation) -> None:
        if reservation.duplicate:
            outcome = "duplicate"
        else:
            outcome = "soft_limit" if reservation.soft_limit_exceeded else "held"
        self._reserved[outcome].inc()

    def _count_settlement(self, settlement: Settlement) -> None:
        if settlement.duplicate:
            self._settled["duplicate"].inc()
            return
        if settlement.unreserved:
            outcome = "unreserved"
        else:
            outcome = "corrected" if settlement.corrected else "settled"
        self._settled[outcome].inc()
        if settlement.currency == self._ledger.prices.currency:
            self._charged.inc(settlement.charged_micros)
        else:  # a record from before a currency change of the deployment
            self._metrics.charged.labels(settlement.currency).inc(settlement.charged_micros)


def _settle_response(settlement: Settlement) -> pb.SettleResponse:
    return pb.SettleResponse(
        request_id=settlement.request_id,
        charged_micros=settlement.charged_micros,
        currency=settlement.currency,
        duplicate=settlement.duplicate,
        corrected=settlement.corrected,
        unreserved=settlement.unreserved,
    )


def _item_status(error: Exception, call: str) -> pb.BatchItemStatus:
    """The status the unary call would have answered with (the interceptor's mapping)."""
    if not isinstance(error, ServiceError):
        _log.error("batch item failed", call=call, error=type(error).__name__)
        error = Internal()
    # BatchItemStatus has google.rpc.Status's wire format.
    return pb.BatchItemStatus.FromString(error.to_proto().SerializeToString())


def _code_name(code: int) -> str:
    return _CODE_NAMES.get(code, "UNKNOWN")


def _children(counter: Counter, outcomes: tuple[str, ...]) -> dict[str, Counter]:
    return {outcome: counter.labels(outcome) for outcome in outcomes}


def timestamp(ms: int) -> timestamp_pb2.Timestamp:
    """A protobuf Timestamp of epoch milliseconds."""
    return timestamp_pb2.Timestamp(seconds=ms // 1000, nanos=(ms % 1000) * 1_000_000)


def _reserve_response(r: Reservation) -> pb.ReserveResponse:
    return pb.ReserveResponse(
        request_id=r.request_id,
        reserved_micros=r.reserved_micros,
        currency=r.currency,
        soft_limit_exceeded=r.soft_limit_exceeded,
        expires_at=timestamp(r.expires_at_ms),
        duplicate=r.duplicate,
        unbudgeted=not r.budgeted,
    )


def _bucket(start_ms: int, t: UsageTotals) -> pb.UsageBucket:
    return pb.UsageBucket(
        start_time=timestamp(start_ms),
        requests=t.requests,
        prompt_tokens=t.prompt_tokens,
        completion_tokens=t.completion_tokens,
        cached_tokens=t.cached_tokens,
        cost_micros=t.cost_micros,
    )


def _budget(status: BudgetStatus) -> pb.Budget:
    limits = status.limits
    budget = pb.Budget(
        tenant_id=limits.tenant_id,
        key_id=limits.key_id,
        period=_PERIODS[limits.period],
        hard_limit_micros=limits.hard_limit_micros,
        soft_limit_micros=limits.soft_limit_micros,
        spent_micros=status.spent_micros,
        reserved_micros=status.reserved_micros,
        currency=status.currency,
    )
    if status.resets_at_ms is not None:
        budget.resets_at.CopyFrom(timestamp(status.resets_at_ms))
    return budget


def _price(p: Price) -> pb.Price:
    return pb.Price(
        model=p.model,
        input_micros_per_mtok=p.input_micros_per_mtok,
        output_micros_per_mtok=p.output_micros_per_mtok,
        cached_input_micros_per_mtok=p.cached_input_micros_per_mtok,
        currency=p.currency,
        effective_from=timestamp(p.effective_from_ms),
    )


def invoice_pb(i: Invoice) -> pb.Invoice:
    return pb.Invoice(
        invoice_id=i.invoice_id,
        tenant_id=i.tenant_id,
        month=i.month,
        currency=i.currency,
        requests=i.requests,
        prompt_tokens=i.prompt_tokens,
        cached_tokens=i.cached_tokens,
        completion_tokens=i.completion_tokens,
        total_micros=i.total_micros,
        issued_at=timestamp(i.issued_at_ms),
        lines=[
            pb.InvoiceLine(
                key_id=line.key_id,
                model=line.model,
                requests=line.requests,
                prompt_tokens=line.prompt_tokens,
                cached_tokens=line.cached_tokens,
                completion_tokens=line.completion_tokens,
                cost_micros=line.cost_micros,
            )
            for line in i.lines
        ],
    )
