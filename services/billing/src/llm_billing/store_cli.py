"""The usage store's commands: `migrate`, `drain`, `reconcile` and `invoice`.

Exit codes: 0 success (reconcile: no difference), 1 reconcile found differences or the
invoice cannot be issued yet, 2 configuration (BILLING_DATABASE_URL missing, ...)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry

from llm_billing.config import Settings
from llm_billing.invoicing import Invoice, month_range
from llm_billing.keys import KeySpace
from llm_billing.metrics import BillingMetrics
from llm_billing.reconcile import format_report
from llm_billing.store import make_client, now_ms
from llm_billing.timeutil import HOUR_MS, rfc3339
from llm_billing.usage_store import UsageStoreParts, build_usage_store
from llm_billing.usagedb import upgrade
from llm_common.config import ConfigError
from llm_common.errors import ServiceError

STORE_COMMANDS = ("migrate", "drain", "reconcile", "invoice")


def add_store_commands(commands: Any) -> None:
    commands.add_parser("migrate", help="run the usage store's schema migrations")
    commands.add_parser("drain", help="write the usage outbox to the store now")
    rec = commands.add_parser("reconcile", help="compare the Redis ledger with the store")
    rec.add_argument("--tenant", help="one tenant (default: all)")
    rec.add_argument("--hours", type=int, default=48, help="hours ending now (default 48)")
    rec.add_argument("--from", dest="start", help="start, ISO 8601 UTC (overrides --hours)")
    rec.add_argument("--to", dest="end", help="end (exclusive), ISO 8601 UTC (default now)")
    inv = commands.add_parser("invoice", help="issue (or show) a tenant's monthly invoice")
    inv.add_argument("--tenant", required=True)
    inv.add_argument("--month", required=True, help="YYYY-MM")
    inv.add_argument("--show", action="store_true", help="only show an issued invoice")


def run_store_command(settings: Settings, args: argparse.Namespace) -> int:
    if not settings.usage_store.enabled:
        raise ConfigError.for_variable("BILLING_DATABASE_URL", "is required for this command")
    return asyncio.run(_run(settings, args))


async def _run(settings: Settings, args: argparse.Namespace) -> int:
    client = make_client(settings.redis)
    metrics = BillingMetrics(CollectorRegistry())
    keys = KeySpace(settings.ledger.key_prefix)
    currency = settings.ledger.default_currency
    if args.command == "invoice":
        from llm_billing.prices import load_prices

        currency = load_prices(settings.prices_config, currency).currency
    parts = build_usage_store(
        settings.usage_store, settings.ledger, client, keys, currency, metrics, now_ms
    )
    try:
        if args.command == "migrate":
            await asyncio.to_thread(upgrade, parts.store.engine)
            print("usage store schema is current")
            return 0
        if not await parts.migrate():
            print("llm-billing: the usage store is unreachable", file=sys.stderr)
            return 1
        return await _command(parts, args)
    finally:
        parts.store.dispose()
        await client.aclose()


async def _command(parts: UsageStoreParts, args: argparse.Namespace) -> int:
    if args.command == "drain":
        written = await parts.outbox.drain()
        print(f"wrote {written} rows; backlog {(await parts.outbox.backlog()).entries}")
        return 0
    if args.command == "reconcile":
        end = _parse_time(args.end) if args.end else now_ms()
        start = _parse_time(args.start) if args.start else end - args.hours * HOUR_MS
        report = await parts.reconciler.run(start // HOUR_MS, -(-end // HOUR_MS), args.tenant)
        for line in format_report(report):
            print(line)
        return 0 if report.clean else 1
    month_range(args.month)
    try:
        if args.show:
            invoice = await parts.invoicing.get(args.tenant, args.month)
        else:
            invoice, created = await parts.invoicing.create(args.tenant, args.month)
            print("issued" if created else "already issued")
    except ServiceError as err:
        print(f"llm-billing: {err}", file=sys.stderr)
        return 1
    for line in format_invoice(invoice):
        print(line)
    return 0


def _parse_time(text: str) -> int:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return round(moment.timestamp() * 1000)


def format_invoice(i: Invoice) -> list[str]:
    """The invoice as text: header, one line per key and model, total (micros exact)."""
    lines = [
        f"invoice {i.invoice_id}  tenant {i.tenant_id}  month {i.month}  "
        f"issued {rfc3339(i.issued_at_ms)}  currency {i.currency}",
        f"{'key':<20} {'model':<24} {'requests':>9} {'prompt':>12} {'cached':>10} "
        f"{'completion':>12} {'cost_micros':>14}",
    ]
    for line in i.lines:
        lines.append(
            f"{line.key_id or '-':<20} {line.model:<24} {line.requests:>9} "
            f"{line.prompt_tokens:>12} {line.cached_tokens:>10} {line.completion_tokens:>12} "
            f"{line.cost_micros:>14}"
        )
    lines.append(
        f"{'total':<45} {i.requests:>9} {i.prompt_tokens:>12} {i.cached_tokens:>10} "
        f"{i.completion_tokens:>12} {i.total_micros:>14}  "
        f"({i.total_micros // 1_000_000}.{i.total_micros % 1_000_000:06d} {i.currency})"
    )
    return lines
