"""Monthly invoices from the SQL usage store: line items per model and key, totals in
micros, issued once and never changed (creating one again returns the issued one)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa

from llm_billing.timeutil import HOUR_MS, Period, period_end_ms
from llm_billing.usage_outbox import UsageOutbox
from llm_billing.usagedb import UsageStore, datetime_ms, invoice_lines, invoices, ms_datetime
from llm_billing.usagedb import usage_records as records
from llm_common.errors import FailedPrecondition, FieldViolation, InvalidArgument, NotFound

_MONTH = re.compile(r"(\d{4})-(\d{2})")


@dataclass(frozen=True, slots=True)
class InvoiceLine:
    key_id: str
    model: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_micros: int


@dataclass(frozen=True, slots=True)
class Invoice:
    invoice_id: str
    tenant_id: str
    month: str  # YYYY-MM
    currency: str
    requests: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    total_micros: int
    issued_at_ms: int
    lines: tuple[InvoiceLine, ...]  # by key, then model


def month_range(month: str) -> tuple[int, int]:
    """[start, end) in epoch ms of a `YYYY-MM` month; InvalidArgument (field `month`)."""
    match = _MONTH.fullmatch(month)
    if match is None or not 1 <= int(match[2]) <= 12 or not 2000 <= int(match[1]) <= 9999:
        raise InvalidArgument([FieldViolation("month", "must be YYYY-MM")])
    start = round(datetime(int(match[1]), int(match[2]), 1, tzinfo=UTC).timestamp() * 1000)
    end = period_end_ms(Period.MONTH, start)
    assert end is not None
    return start, end


def invoice_id(tenant: str, month: str) -> str:
    return f"inv-{tenant}-{month}"


def create_invoice(
    store: UsageStore, tenant: str, month: str, currency: str, now_ms: int
) -> tuple[Invoice, bool]:
    """Issue the invoice from the month's charged rows (blocking); (invoice, created). An
    invoice already issued is returned unchanged."""
    existing = get_invoice(store, tenant, month)
    if existing is not None:
        return existing, False
    start, end = month_range(month)
    c = records.c
    query = (
        sa.select(
            c.key_id,
            c.model,
            c.currency,
            sa.func.count(),
            sa.func.sum(c.prompt_tokens),
            sa.func.sum(c.cached_tokens),
            sa.func.sum(c.completion_tokens),
            sa.func.sum(c.cost_micros),
        )
        .where(
            c.tenant_id == tenant,
            c.started_hour >= start // HOUR_MS,
            c.started_hour < end // HOUR_MS,
            c.status != "released",
        )
        .group_by(c.key_id, c.model, c.currency)
        .order_by(c.key_id, c.model)
    )
    ident = invoice_id(tenant, month)
    try:
        with store.engine.begin() as conn:
            rows = conn.execute(query).all()
            others = {r[2] for r in rows} - {currency}
            if others:
                raise FailedPrecondition(f"usage in other currencies: {sorted(others)}")
            lines = [InvoiceLine(r[0], r[1], *(int(v or 0) for v in r[3:])) for r in rows]
            invoice = _totals(ident, tenant, month, currency, now_ms, tuple(lines))
            conn.execute(sa.insert(invoices).values(**_header_values(invoice)))
            if lines:
                conn.execute(
                    sa.insert(invoice_lines),
                    [{"invoice_id": ident, **_line_values(line)} for line in lines],
                )
    except sa.exc.IntegrityError:  # issued concurrently by another process
        raced = get_invoice(store, tenant, month)
        if raced is None:
            raise
        return raced, False
    return invoice, True


def get_invoice(store: UsageStore, tenant: str, month: str) -> Invoice | None:
    ident = invoice_id(tenant, month)
    with store.engine.connect() as conn:
        head = (
            conn.execute(sa.select(invoices).where(invoices.c.invoice_id == ident))
            .mappings()
            .first()
        )
        if head is None:
            return None
        rows = (
            conn.execute(
                sa.select(invoice_lines)
                .where(invoice_lines.c.invoice_id == ident)
                .order_by(invoice_lines.c.key_id, invoice_lines.c.model)
            )
            .mappings()
            .all()
        )
    lines = tuple(
        InvoiceLine(**{k: v for k, v in row.items() if k != "invoice_id"}) for row in rows
    )
    return Invoice(
        invoice_id=ident,
        tenant_id=head["tenant_id"],
        month=head["month"],
        currency=head["currency"],
        requests=head["requests"],
        prompt_tokens=head["prompt_tokens"],
        cached_tokens=head["cached_tokens"],
        completion_tokens=head["completion_tokens"],
        total_micros=head["total_micros"],
        issued_at_ms=datetime_ms(head["issued_at"]),
        lines=lines,
    )


def _totals(
    ident: str, tenant: str, month: str, currency: str, now_ms: int, lines: tuple[InvoiceLine, ...]
) -> Invoice:
    return Invoice(
        invoice_id=ident,
        tenant_id=tenant,
        month=month,
        currency=currency,
        requests=sum(line.requests for line in lines),
        prompt_tokens=sum(line.prompt_tokens for line in lines),
        cached_tokens=sum(line.cached_tokens for line in lines),
        completion_tokens=sum(line.completion_tokens for line in lines),
        total_micros=sum(line.cost_micros for line in lines),
        issued_at_ms=now_ms,
        lines=lines,
    )


def _header_values(i: Invoice) -> dict[str, object]:
    return {
        "invoice_id": i.invoice_id,
        "tenant_id": i.tenant_id,
        "month": i.month,
        "currency": i.currency,
        "requests": i.requests,
        "prompt_tokens": i.prompt_tokens,
        "cached_tokens": i.cached_tokens,
        "completion_tokens": i.completion_tokens,
        "total_micros": i.total_micros,
        "issued_at": ms_datetime(i.issued_at_ms),
    }


def _line_values(line: InvoiceLine) -> dict[str, object]:
    return {
        "key_id": line.key_id,
        "model": line.model,
        "requests": line.requests,
        "prompt_tokens": line.prompt_tokens,
        "cached_tokens": line.cached_tokens,
        "completion_tokens": line.completion_tokens,
        "cost_micros": line.cost_micros,
    }


class Invoicing:
    """CreateInvoice / GetInvoice: a month can be invoiced once it is over (and its last
    reservations have expired); the tenant's outbox is drained first."""

    def __init__(
        self,
        store: UsageStore,
        outbox: UsageOutbox,
        currency: str,
        settle_window_ms: int,
        clock: Callable[[], int],
    ) -> None:
        self._store = store
        self._outbox = outbox
        self._currency = currency
        self._settle_window_ms = settle_window_ms
        self._clock = clock

    async def create(self, tenant: str, month: str) -> tuple[Invoice, bool]:
        _, end = month_range(month)
        existing = await asyncio.to_thread(get_invoice, self._store, tenant, month)
        if existing is not None:
            return existing, False
        if self._clock() < end + self._settle_window_ms:
            raise FailedPrecondition(
                f"month {month} can be invoiced once it is over and its open reservations"
                " have expired"
            )
        await self._outbox.drain(tenant)
        if (await self._outbox.backlog(tenant)).entries:
            raise FailedPrecondition("the tenant's usage outbox is not drained yet; retry")
        return await asyncio.to_thread(
            create_invoice, self._store, tenant, month, self._currency, self._clock()
        )

    async def get(self, tenant: str, month: str) -> Invoice:
        month_range(month)
        invoice = await asyncio.to_thread(get_invoice, self._store, tenant, month)
        if invoice is None:
            raise NotFound("invoice", invoice_id(tenant, month))
        return invoice
