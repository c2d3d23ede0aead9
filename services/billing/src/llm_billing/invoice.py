"""ExportUsage: one CSV line (RFC 4180) per charged request, for invoicing."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator, Sequence

import redis.asyncio

from llm_billing.keys import KeySpace
from llm_billing.timeutil import rfc3339
from llmapi.common.v1 import common_pb2

PAGE = 500
HEADER = (
    "request_id",
    "tenant_id",
    "key_id",
    "model",
    "admitted_at",
    "settled_at",
    "status",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "cost_micros",
    "currency",
    "finish_reason",
)
# Record fields (see lua/): state, key, model, admitted/settled/expired at, tokens,
# cost, currency, finish reason, reserved prompt/completion/amount, corrected flag.
_FIELDS = [
    "st", "k", "m", "at", "sa", "xa", "pt", "ct", "ch", "c", "cur", "fr", "pt0", "mc", "rs", "cr",
]  # fmt: skip
_FINISH_PREFIX = "FINISH_REASON_"


def csv_line(values: Sequence[str]) -> str:
    """One RFC 4180 line without its line break."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="").writerow(values)
    return buffer.getvalue()


class InvoiceExporter:
    """Streams settled, corrected and expired records admitted in a time range."""

    def __init__(self, client: redis.asyncio.Redis, keys: KeySpace) -> None:
        self._client = client
        self._keys = keys

    async def lines(self, tenant_id: str | None, start_ms: int, end_ms: int) -> AsyncIterator[str]:
        """The header, then one line per charged request, tenant by tenant (sorted), each
        tenant's in admission order. `tenant_id` None: every tenant."""
        yield csv_line(HEADER)
        for tenant in await self._tenants(tenant_id):
            async for page in self._pages(tenant, start_ms, end_ms):
                for request_id, record in zip(page, await self._records(tenant, page), strict=True):
                    row = invoice_row(request_id, tenant, record)
                    if row is not None:
                        yield csv_line(row)

    async def _tenants(self, tenant_id: str | None) -> list[str]:
        if tenant_id is not None:
            return [tenant_id]
        return sorted([t async for t in self._client.sscan_iter(self._keys.tenants(), count=500)])

    async def _pages(self, tenant: str, start_ms: int, end_ms: int) -> AsyncIterator[list[str]]:
        """Request ids by admission time, paged by score (an offset only within one score)."""
        key, low, seen_at_low = self._keys.records_by_time(tenant), start_ms, 0
        while True:
            reply = await self._client.zrangebyscore(
                key, low, f"({end_ms}", start=seen_at_low, num=PAGE, withscores=True
            )
            rows = [(str(row[0]), float(row[1])) for row in reply]
            if not rows:
                return
            yield [member for member, _ in rows]
            top = rows[-1][1]
            at_top = sum(1 for _, score in rows if score == top)
            seen_at_low = seen_at_low + at_top if top == low else at_top
            low = int(top)
            if len(rows) < PAGE:
                return

    async def _records(self, tenant: str, request_ids: list[str]) -> list[list[str | None]]:
        async with self._client.pipeline(transaction=False) as pipe:
            for request_id in request_ids:
                pipe.hmget(self._keys.record(tenant, request_id), _FIELDS)
            records: list[list[str | None]] = await pipe.execute()
        return records


def invoice_row(request_id: str, tenant: str, record: list[str | None]) -> list[str] | None:
    """The CSV cells of a record (HMGET of `_FIELDS`); None when nothing was charged."""
    r = dict(zip(_FIELDS, record, strict=True))
    state = r["st"]
    if state == "S":
        status = "corrected" if r["cr"] == "1" else "settled"
        tokens, cost, settled_at = (r["pt"], r["ct"], r["ch"]), r["c"], r["sa"]
        finish = _finish_name(r["fr"])
    elif state == "E":
        status, tokens, cost, settled_at = "expired", (r["pt0"], r["mc"], "0"), r["rs"], r["xa"]
        finish = ""
    else:  # open, released, or already gone: nothing charged
        return None
    return [
        request_id,
        tenant,
        r["k"] or "",
        r["m"] or "",
        rfc3339(int(r["at"] or 0)),
        rfc3339(int(settled_at or 0)),
        status,
        *(t or "0" for t in tokens),
        cost or "0",
        r["cur"] or "",
        finish,
    ]


def _finish_name(value: str | None) -> str:
    number = int(value or 0)
    if number not in common_pb2.FinishReason.values():
        return ""
    name = common_pb2.FinishReason.Name(number)  # type: ignore[arg-type]
    return "" if number == 0 else name.removeprefix(_FINISH_PREFIX).lower()
