"""Failover under load on a local Redis Cluster (used by bench_cluster.py and the cluster
test suite): a master is SIGKILLed while billing Reserve+Settle pairs (with WAIT 1) and two
auth limiters' decisions flow; every client retries an idempotent call until it succeeds.

Checks: the time from the kill until every call succeeds again; the ledger equals the sum
of the charges the clients were told about, to the micro-unit (with WAIT nothing
acknowledged is lost); the rate limit admits at most one bucket more than exact.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from llm_auth.config import RedisSettings as AuthRedisSettings
from llm_auth.keyspace import Keyspace
from llm_auth.limiter import BucketSpec, Limiter
from llm_auth.redis_guard import RedisGuard, StoreUnavailable, connect
from llm_billing.budgets import BudgetLimits
from llm_billing.config import LedgerSettings, RedisSettings, Settings
from llm_billing.ledger_values import ReserveInput, SettleInput, Usage
from llm_billing.prices import load_prices
from llm_billing.server import build_billing
from llm_billing.timeutil import Period
from llm_testing import settings_for_tests
from llm_testing.redis_cluster_local import LocalCluster

PRICES = """currency: USD
prices:
  - model: small
    effective_from: "2020-01-01T00:00:00Z"
    input_micros_per_mtok: 333333
    cached_input_micros_per_mtok: 111111
    output_micros_per_mtok: 1777777
"""
TENANTS = tuple(f"fo{i}" for i in range(12))  # spread over every master
LIMIT_PER_MIN = 100
RETRY_PAUSE_S = 0.05
HUGE = 10**15
AUTH_BREAKER_RESET_S = 2.0


@dataclass
class FailoverResult:
    """What the scenario measured (written to bench/results/cluster.json)."""

    killed_port: int
    billing_pairs_acked: int
    billing_failures: int
    recovery_s: float  # kill -> last failed call of either service (0: none failed)
    billing_recovery_s: float
    limiter_recovery_s: float
    ledger_micros: int
    client_micros: int
    limiter_admitted: int
    limiter_exact: float  # limit + what refilled during the run
    limiter_failures: int
    duration_s: float
    wait_replicas: int
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Tally:
    failures: list[float] = field(default_factory=list)
    limiter_failed_at: list[float] = field(default_factory=list)
    last_errors: dict[str, float] = field(default_factory=dict)
    charged: dict[str, int] = field(default_factory=dict)
    admitted: int = 0
    limiter_failures: int = 0


async def run_failover(
    cluster: LocalCluster,
    workdir: Path,
    *,
    duration_s: float = 12.0,
    kill_at_s: float = 2.0,
    billing_workers: int = 16,
    limiter_workers: int = 8,
    restart_after_s: float = 1.0,
) -> FailoverResult:
    """Run the scenario on `cluster` (which loses one master)."""
    prices_path = workdir / "prices.yaml"
    prices_path.write_text(PRICES, encoding="utf-8")
    settings = Settings(
        server=settings_for_tests("billing"),
        redis=RedisSettings(cluster.url, timeout_s=1.0, wait_replicas=1, wait_timeout_ms=500),
        prices_config=prices_path,
        ledger=LedgerSettings(key_prefix="fo:billing:"),
    )
    billing = build_billing(settings, load_prices(prices_path, "USD"))
    # The breaker retries Redis 2 s after opening (the default is 5 s): AUTH_REDIS_BREAKER_RESET_S.
    auth_settings = AuthRedisSettings(
        url=cluster.url, prefix="fo:auth:", timeout_s=0.5, breaker_reset_s=AUTH_BREAKER_RESET_S
    )
    clients = [connect(auth_settings) for _ in range(2)]  # two auth replicas
    limiters = [Limiter(RedisGuard(c, auth_settings), Keyspace("fo:auth:")) for c in clients]
    tally = _Tally()
    try:
        for tenant in TENANTS:
            await billing.budgets.set(BudgetLimits(tenant, "", Period.TOTAL, HUGE, 0))
        start = time.monotonic()
        stop_at = start + duration_s
        tasks = [
            asyncio.create_task(_billing_worker(billing, w, stop_at, tally))
            for w in range(billing_workers)
        ]
        tasks += [
            asyncio.create_task(_limiter_worker(limiters[w % 2], stop_at, tally))
            for w in range(limiter_workers)
        ]
        await asyncio.sleep(kill_at_s)
        killed_at = time.monotonic()
        victim = await asyncio.to_thread(cluster.kill_master)
        # The operator replaces the dead node by an empty one, the replica of the node that
        # took its slots over: WAIT 1 can be met there again (until then, Reserve/Settle on
        # those slots answer UNAVAILABLE and the clients retry).
        await asyncio.sleep(restart_after_s)
        await asyncio.to_thread(cluster.replace, victim)
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - start
        billing_after = [t - killed_at for t in tally.failures if t >= killed_at]
        limiter_after = [t - killed_at for t in tally.limiter_failed_at if t >= killed_at]
        ledger = 0
        for tenant in TENANTS:
            ledger += (await billing.budgets.get(tenant, "")).spent_micros
        return FailoverResult(
            killed_port=victim,
            billing_pairs_acked=len(tally.charged),
            billing_failures=len(tally.failures),
            recovery_s=round(max(billing_after + limiter_after, default=0.0), 3),
            billing_recovery_s=round(max(billing_after, default=0.0), 3),
            limiter_recovery_s=round(max(limiter_after, default=0.0), 3),
            ledger_micros=ledger,
            client_micros=sum(tally.charged.values()),
            limiter_admitted=tally.admitted,
            limiter_exact=round(LIMIT_PER_MIN * (1 + elapsed / 60), 2),
            limiter_failures=tally.limiter_failures,
            duration_s=round(elapsed, 3),
            wait_replicas=settings.redis.wait_replicas,
            notes=[
                f"billing {name} last seen {at - killed_at:.1f} s after the kill"
                for name, at in sorted(tally.last_errors.items(), key=lambda kv: kv[1])
            ],
        )
    finally:
        for limiter in limiters:
            await limiter.aclose()
        for client in clients:
            await client.aclose()
        await billing.aclose()


async def _retry(call: Any, tally: _Tally, give_up_at: float) -> Any:
    while True:
        try:
            return await call()
        except Exception as exc:
            # Unavailable, ConnectionError, ReplicaWaitError, ClusterDown, MOVED storms...
            tally.failures.append(time.monotonic())
            tally.last_errors[type(exc).__name__] = time.monotonic()
            if time.monotonic() > give_up_at:
                raise
            await asyncio.sleep(RETRY_PAUSE_S)


async def _billing_worker(billing: Any, worker: int, stop_at: float, tally: _Tally) -> None:
    i = 0
    while time.monotonic() < stop_at:
        tenant = TENANTS[(worker + i) % len(TENANTS)]
        rid = f"fo-{worker}-{i}"
        prompt, completion = 100 + i % 977, 1 + (worker * 31 + i) % 499
        reserve = ReserveInput(rid, tenant, "k1", "small", prompt, 500)
        settle = SettleInput(rid, tenant, Usage(prompt, completion, 0, 1))
        give_up = stop_at + 20.0
        await _retry(lambda r=reserve: billing.ledger.reserve(r), tally, give_up)
        done = await _retry(lambda s=settle: billing.ledger.settle(s), tally, give_up)
        tally.charged[rid] = done.charged_micros
        i += 1


async def _limiter_worker(limiter: Limiter, stop_at: float, tally: _Tally) -> None:
    bucket = BucketSpec("req:key:fo", limit=LIMIT_PER_MIN)
    while time.monotonic() < stop_at:
        try:
            decision = await limiter.hit("fo-tenant", [bucket], 1)
        except StoreUnavailable:
            tally.limiter_failures += 1
            tally.limiter_failed_at.append(time.monotonic())
            await asyncio.sleep(RETRY_PAUSE_S)
            continue
        if decision.allowed:
            tally.admitted += 1
        else:
            await asyncio.sleep(0.01)
