"""Billing test fixtures: a price file, settings on a per-test key prefix, the wired service,
a running gRPC server, and an independent implementation of the rounding rule."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

from llm_billing.config import LedgerSettings, RedisSettings, Settings
from llm_billing.metrics import BillingMetrics
from llm_billing.prices import PriceBook, load_prices
from llm_billing.server import Billing, build_billing, build_spec
from llm_common.redis_conn import is_cluster_url
from llm_testing import (
    PrivateRedis,
    RunningServer,
    running_server,
    settings_for_tests,
)
from llmapi.billing.v1 import billing_service_pb2_grpc as pb_grpc

# Prices per 1M tokens in micros; `odd` has prices that make rounding visible.
PRICES_YAML = """
currency: USD
prices:
  - model: small
    effective_from: "2020-01-01T00:00:00Z"
    input_micros_per_mtok: 150000
    cached_input_micros_per_mtok: 75000
    output_micros_per_mtok: 600000
  - model: odd
    effective_from: "2020-01-01T00:00:00Z"
    input_micros_per_mtok: 333333
    cached_input_micros_per_mtok: 111111
    output_micros_per_mtok: 1777777
  - model: big
    effective_from: "2020-01-01T00:00:00Z"
    input_micros_per_mtok: 3000000
    cached_input_micros_per_mtok: 1500000
    output_micros_per_mtok: 15000000
"""
MICROS_PER_MTOK = 1_000_000


@pytest.fixture
def prices_path(tmp_path: Path) -> Path:
    path = tmp_path / "prices.yaml"
    path.write_text(PRICES_YAML, encoding="utf-8")
    return path


@pytest.fixture
def prices(prices_path: Path) -> PriceBook:
    return load_prices(prices_path, "USD")


@pytest.fixture
def settings(redis_url: str, redis_prefix: str, prices_path: Path) -> Settings:
    """Settings on this test's key prefix (cleaned up by the `redis_client` fixture)."""
    return Settings(
        server=settings_for_tests("billing"),
        # On a cluster (`make test-cluster`) Reserve/Settle wait for one replica, as in prod.
        redis=RedisSettings(redis_url, wait_replicas=int(is_cluster_url(redis_url))),
        prices_config=prices_path,
        ledger=LedgerSettings(key_prefix=f"{redis_prefix}billing:"),
    )


@pytest.fixture
def metrics() -> BillingMetrics:
    return BillingMetrics(CollectorRegistry())


@pytest.fixture
async def billing(
    settings: Settings,
    prices: PriceBook,
    metrics: BillingMetrics,
    redis_client: redis.asyncio.Redis,  # removes the prefix's keys afterwards
) -> AsyncIterator[Billing]:
    built = build_billing(settings, prices, metrics=metrics)
    try:
        yield built
    finally:
        await built.aclose()


@pytest.fixture
async def server(
    settings: Settings,
    prices: PriceBook,
    metrics: BillingMetrics,
    redis_client: redis.asyncio.Redis,
) -> AsyncIterator[RunningServer]:
    built = build_billing(settings, prices, metrics=metrics)
    async with running_server(build_spec(built), settings=settings.server) as running:
        yield running


@pytest.fixture
def stub(server: RunningServer) -> pb_grpc.BillingServiceAsyncStub:
    return pb_grpc.BillingServiceStub(server.channel)


@pytest.fixture
async def on_private_redis(
    settings: Settings, prices: PriceBook, private_redis: Callable[..., PrivateRedis]
) -> AsyncIterator[tuple[PrivateRedis, pb_grpc.BillingServiceAsyncStub]]:
    """A billing server on a Redis of its own (which the test may kill and restart), with
    a short Redis timeout so an outage is seen quickly; its stub."""
    store = private_redis()
    own = dataclasses.replace(
        settings,
        redis=RedisSettings(store.url, timeout_s=0.5),
        ledger=LedgerSettings(key_prefix="billing:"),
    )
    built = build_billing(own, prices, metrics=BillingMetrics(CollectorRegistry()))
    async with running_server(build_spec(built), settings=own.server) as running:
        yield store, pb_grpc.BillingServiceStub(running.channel)


def cost_micros(
    prices: PriceBook, model: str, prompt: int, completion: int, cached: int, at_ms: int
) -> int:
    """The documented rounding rule, computed independently of the Lua scripts:
    ceil(((prompt - cached) * input + cached * cached_input + completion * output) / 1e6)."""
    price = prices.at(model, at_ms)
    assert price is not None
    numerator = (
        (prompt - cached) * price.input_micros_per_mtok
        + cached * price.cached_input_micros_per_mtok
        + completion * price.output_micros_per_mtok
    )
    return -(-numerator // MICROS_PER_MTOK)


@pytest.fixture
def cost_of(prices: PriceBook) -> Callable[..., int]:
    """cost_of(model, prompt, completion, cached=0, at_ms=now-ish) with the test prices."""

    def cost(model: str, prompt: int, completion: int, cached: int = 0, at_ms: int = 0) -> int:
        return cost_micros(prices, model, prompt, completion, cached, at_ms or 2**60)

    return cost


@pytest.fixture
def reserve_of(prices: PriceBook) -> Callable[[str, int, int], int]:
    """reserve_of(model, prompt, max_completion): the worst case Reserve must hold."""

    def reserve(model: str, prompt: int, max_completion: int) -> int:
        price = prices.at(model, 2**60)
        assert price is not None
        worst_input = max(price.input_micros_per_mtok, price.cached_input_micros_per_mtok)
        numerator = prompt * worst_input + max_completion * price.output_micros_per_mtok
        return -(-numerator // MICROS_PER_MTOK)

    return reserve
