"""Wiring: price book, Redis ledger and sweeper, then BillingService on llm_common's server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import redis.asyncio
from redis.exceptions import RedisClusterException

from llm_billing.budgets import Budgets
from llm_billing.config import Settings
from llm_billing.erasure import TenantEraser
from llm_billing.invoice import InvoiceExporter
from llm_billing.keys import KeySpace
from llm_billing.ledger import Ledger
from llm_billing.metrics import BillingMetrics, default_billing_metrics
from llm_billing.prices import PriceBook, load_prices
from llm_billing.service import BillingServicer
from llm_billing.store import STORE_UNAVAILABLE, make_client, now_ms, replica_wait
from llm_billing.sweeper import Sweeper
from llm_billing.usage import UsageReader
from llm_billing.usage_store import UsageStoreParts, build_usage_store
from llm_common import server as common_server
from llm_common.config import ConfigError
from llm_common.logging import get_logger
from llm_common.redis_conn import is_cluster_client
from llm_common.resilience import Backoff
from llm_common.server import BuiltServer, ServiceSpec
from llmapi.billing.v1 import billing_service_pb2 as pb
from llmapi.billing.v1 import billing_service_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["BillingService"].full_name
# The per-request calls (thousands a second) log their access line at DEBUG, like auth's
# Check; they are still counted in llm_rpc_* metrics, and failures log on their own.
QUIET_METHODS = frozenset(
    f"/{SERVICE_NAME}/{m}" for m in ("Reserve", "Settle", "Release", "SettleBatch")
)
REDIS_WAIT = Backoff(base=0.2, cap=2.0, jitter=0.2, max_attempts=15)  # about 25 s in all
_log = get_logger(__name__)


@dataclass(frozen=True, slots=True)
class Billing:
    """The wired service: its Redis client, domain components, servicer and sweeper."""

    client: redis.asyncio.Redis
    ledger: Ledger
    budgets: Budgets
    usage: UsageReader
    invoices: InvoiceExporter
    servicer: BillingServicer
    sweeper: Sweeper
    usage_store: UsageStoreParts | None = None  # BILLING_DATABASE_URL set

    async def aclose(self) -> None:
        """Close the ledger's hot-path connection, the database pool and the Redis client."""
        if self.usage_store is not None:
            await self.usage_store.stop()
        await self.ledger.aclose()
        await self.client.aclose()


def build_billing(
    settings: Settings,
    prices: PriceBook,
    *,
    metrics: BillingMetrics | None = None,
    clock: Callable[[], int] = now_ms,
) -> Billing:
    """Every component over one Redis client (nothing connects until first use)."""
    client = make_client(settings.redis)
    keys = KeySpace(settings.ledger.key_prefix)
    metrics = metrics or default_billing_metrics()
    store_on = settings.usage_store.enabled
    ledger = Ledger(
        client, keys, prices, settings.ledger, clock=clock, outbox=store_on,
        wait=replica_wait(settings.redis),
    )  # fmt: skip
    budgets = Budgets(client, keys, prices.currency, clock=clock)
    usage, invoices = UsageReader(client, keys), InvoiceExporter(client, keys)
    parts = None
    if store_on:
        parts = build_usage_store(
            settings.usage_store, settings.ledger, client, keys, prices.currency, metrics, clock
        )
    eraser = TenantEraser(client, keys, parts.store if parts is not None else None)
    servicer = BillingServicer(
        ledger, budgets, usage, invoices, settings.limits, metrics, usage_store=parts,
        eraser=eraser,
    )  # fmt: skip
    sweeper = Sweeper(ledger, settings.ledger.sweep_interval_s, metrics)
    return Billing(client, ledger, budgets, usage, invoices, servicer, sweeper, parts)


def build_spec(billing: Billing) -> ServiceSpec:
    """The ServiceSpec for llm_common.server: health turns SERVING once Redis answers."""

    def register(server: grpc.aio.Server) -> None:
        pb_grpc.add_BillingServiceServicer_to_server(billing.servicer, server)

    async def on_start() -> None:
        await wait_for_redis(billing.client)
        billing.sweeper.start()
        if billing.usage_store is not None:
            # Migrations run here once; a database that is down does not stop billing from
            # serving (settles only need Redis): the drainer migrates when it comes back.
            await billing.usage_store.migrate()
            billing.usage_store.start()

    async def on_stop() -> None:
        await billing.sweeper.stop()
        await billing.aclose()

    return ServiceSpec(
        (SERVICE_NAME,), register, on_start=on_start, on_stop=on_stop, quiet_methods=QUIET_METHODS
    )


# Redis is not (yet) there; RedisClusterException: no seed node of a cluster answers.
START_FAILURES: tuple[type[Exception], ...] = (*STORE_UNAVAILABLE, RedisClusterException)


async def wait_for_redis(client: redis.asyncio.Redis, backoff: Backoff = REDIS_WAIT) -> None:
    """PING until Redis answers; ConfigError (naming REDIS_URL) when it never does."""
    delays = iter(backoff)
    while True:
        try:
            await client.ping()
            return
        except START_FAILURES as exc:
            delay = next(delays, None)
            if delay is None:
                raise ConfigError.for_variable(
                    "REDIS_CLUSTER_NODES" if is_cluster_client(client) else "REDIS_URL",
                    f"Redis did not answer ({type(exc).__name__})",
                ) from exc
            _log.warning("waiting for Redis", error=type(exc).__name__, retry_in_s=delay)
            await asyncio.sleep(delay)


async def serve(
    settings: Settings,
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[BuiltServer], None] | None = None,
) -> None:
    """Load the prices, then serve until SIGTERM/SIGINT (or `stop`)."""
    prices = load_prices(settings.prices_config, settings.ledger.default_currency)
    billing = build_billing(settings, prices)
    await common_server.serve(settings.server, build_spec(billing), stop=stop, ready=ready)
