"""Disaster recovery: export -> flush -> restore gives the same ledger, damaged snapshots are
refused, and the ledger survives a Redis crash with AOF (appendfsync everysec)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis.asyncio
from google.protobuf import timestamp_pb2

from llm_billing.budgets import BudgetLimits
from llm_billing.config import RedisSettings, Settings
from llm_billing.ledger_values import ReserveInput, SettleInput, Usage
from llm_billing.prices import PriceBook
from llm_billing.server import Billing, build_billing
from llm_billing.timeutil import Period
from llm_testing import RunningServer
from llmapi.billing.v1 import billing_service_pb2 as pb
from llmapi.billing.v1 import billing_service_pb2_grpc as pb_grpc

if TYPE_CHECKING:
    Stub = pb_grpc.BillingServiceAsyncStub

pytestmark = pytest.mark.integration


def cli(
    settings: Settings, *args: str, prefix: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "REDIS_URL": settings.redis.url,
        "BILLING_KEY_PREFIX": prefix or settings.ledger.key_prefix,
        "LOG_LEVEL": "WARNING",
    }
    return subprocess.run(
        [sys.executable, "-m", "llm_billing", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def ledger_view(stub: Stub, window: dict[str, Any]) -> dict[str, Any]:
    """Everything a client can see of tenant acme's ledger."""
    usage = await stub.GetUsage(
        pb.GetUsageRequest(tenant_id="acme", granularity=pb.GRANULARITY_HOUR, **window)
    )
    budget = await stub.GetBudget(pb.GetBudgetRequest(tenant_id="acme"))
    lines = [m.line async for m in stub.ExportUsage(pb.ExportUsageRequest(**window))]
    return {"usage": usage, "budget": budget, "export": lines}


async def delete_prefix(client: redis.asyncio.Redis, prefix: str) -> None:
    keys = [key async for key in client.scan_iter(match=f"{prefix}*")]
    if keys:
        await client.delete(*keys)


async def test_export_flush_restore_gives_the_same_ledger(
    server: RunningServer, settings: Settings, redis_client: redis.asyncio.Redis, tmp_path: Path
) -> None:
    stub = pb_grpc.BillingServiceStub(server.channel)
    budget = pb.Budget(tenant_id="acme", period=pb.BUDGET_PERIOD_MONTH, hard_limit_micros=10**9)
    await stub.SetBudget(pb.SetBudgetRequest(budget=budget))
    for i in range(60):
        await stub.Reserve(
            pb.ReserveRequest(
                request_id=f"r{i}",
                tenant_id="acme",
                key_id=f"k{i % 3}",
                model=("small", "odd")[i % 2],
                prompt_tokens=100 + i,
                max_completion_tokens=64,
            )
        )
        if i % 10 == 9:
            await stub.Release(pb.ReleaseRequest(request_id=f"r{i}"))
        elif i < 55:  # r55..r58 stay open
            await stub.Settle(
                pb.SettleRequest(
                    request_id=f"r{i}", prompt_tokens=100 + i, completion_tokens=i, cached_tokens=i
                )
            )
    now = int(time.time())
    window = {
        "start_time": timestamp_pb2.Timestamp(seconds=now - 7200),
        "end_time": timestamp_pb2.Timestamp(seconds=now + 7200),
    }
    before = await ledger_view(stub, window)
    snapshot = tmp_path / "ledger.jsonl"

    exported = cli(settings, "export", "--output", str(snapshot))
    assert exported.returncode == 0, exported.stderr
    await delete_prefix(redis_client, settings.ledger.key_prefix)
    emptied = await stub.GetUsage(pb.GetUsageRequest(tenant_id="acme", **window))
    assert emptied.total.requests == 0
    restored = cli(settings, "restore", "--input", str(snapshot))
    assert restored.returncode == 0, restored.stderr
    assert "restored" in restored.stderr

    assert await ledger_view(stub, window) == before
    # The restored ledger keeps working: open reservations settle, settled ones stay settled.
    late = await stub.Settle(pb.SettleRequest(request_id="r55", prompt_tokens=155))
    assert not late.duplicate
    assert (await stub.Settle(pb.SettleRequest(request_id="r0"))).duplicate
    record = f"{settings.ledger.key_prefix}{{acme}}:rec:r0"
    assert await redis_client.pttl(record) > 30 * 86_400_000  # retention TTLs came back


async def test_damaged_snapshots_and_non_empty_ledgers_are_refused(
    billing: Billing, settings: Settings, redis_client: redis.asyncio.Redis, tmp_path: Path
) -> None:
    await billing.ledger.reserve(ReserveInput("r1", "acme", "k", "small", 10, 10))
    snapshot = tmp_path / "ledger.jsonl"
    assert cli(settings, "export", "-o", str(snapshot)).returncode == 0

    refused = cli(settings, "restore", "-i", str(snapshot))
    assert refused.returncode == 1
    assert "exist" in refused.stderr
    assert cli(settings, "restore", "-i", str(snapshot), "--force").returncode == 0

    empty_prefix = settings.ledger.key_prefix + "other:"
    lines = snapshot.read_text(encoding="utf-8").splitlines()
    truncated = tmp_path / "truncated.jsonl"
    truncated.write_text("\n".join(lines[:-2]) + "\n", encoding="utf-8")
    damaged = tmp_path / "damaged.jsonl"
    tampered = lines[2].replace('"pttl":', '"pttl": ')  # same data, but not the exported bytes
    damaged.write_text("\n".join([*lines[:2], tampered, *lines[3:]]) + "\n", encoding="utf-8")
    for bad, reason in ((truncated, "truncated"), (damaged, "damaged")):
        result = cli(settings, "restore", "-i", str(bad), prefix=empty_prefix)
        assert result.returncode == 1
        assert reason in result.stderr
    assert [k async for k in redis_client.scan_iter(match=f"{empty_prefix}*")] == []


async def test_ledger_survives_a_redis_crash_with_aof(
    settings: Settings,
    prices: PriceBook,
    private_redis: Callable[..., Any],
    cost_of: Callable[..., int],
) -> None:
    store = private_redis(aof=True)
    own = dataclasses.replace(settings, redis=RedisSettings(store.url))
    b = build_billing(own, prices)
    expected = 0
    try:
        for i in range(300):
            await b.ledger.reserve(ReserveInput(f"r{i}", "acme", "k", "big", 1000 + i, 100))
            settled = await b.ledger.settle(
                SettleInput(f"r{i}", "", Usage(1000 + i, i % 100, 0, 1))
            )
            expected += settled.charged_micros
        assert expected == sum(cost_of("big", 1000 + i, i % 100) for i in range(300))
        await asyncio.sleep(1.5)  # appendfsync everysec: at most one second is at risk
        store.kill()
        store.start()
        # Balances are kept for every period, so a budget set now sees all the spend.
        status = await b.budgets.set(BudgetLimits("acme", "", Period.TOTAL, 0, 0))
        assert (status.spent_micros, status.reserved_micros) == (expected, 0)
        again = await b.ledger.settle(SettleInput("r7", "acme", Usage(1, 1, 0, 1)))
        assert again.duplicate  # idempotency survived the crash too
        assert again.charged_micros == cost_of("big", 1007, 7)
    finally:
        await b.aclose()
