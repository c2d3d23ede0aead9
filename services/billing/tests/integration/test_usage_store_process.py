"""`python -m llm_billing` with a usage store: SIGKILLed mid-run, and its database stopped
under load; afterwards the store holds exactly one row per answered request with the
tokens the clients were told, and reconciliation reports no difference.

The database outage lasts BILLING_TEST_DB_OUTAGE_S (3 s); the `chaos` variant, 30 s:
`.venv/bin/pytest services/billing -m chaos -k outage`."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import redis.asyncio
import sqlalchemy as sa

from llm_billing.config import Settings
from llm_billing.keys import KeySpace
from llm_billing.usagedb import driver_url
from llm_testing import free_port
from llmapi.billing.v1 import billing_service_pb2 as pb
from llmapi.billing.v1 import billing_service_pb2_grpc as pb_grpc

from .pg import private_postgres, scratch_database
from .test_process import billing_env, call_until_done, processes, start

pytestmark = pytest.mark.integration
__all__ = ["processes"]  # the fixture, shared with test_process
Answered = dict[str, tuple[str, str, int, int, int]]  # rid -> tenant, model, pt, ct, cost


@pytest.fixture(params=["sqlite", "postgres"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/usage.db"
        return
    with scratch_database() as url:
        yield url


def store_env(settings: Settings, port: int, url: str) -> dict[str, str]:
    return billing_env(settings, port) | {
        "BILLING_DATABASE_URL": url,
        "BILLING_OUTBOX_INTERVAL_S": "0.1",
        "BILLING_DATABASE_TIMEOUT_S": "1",
    }


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llm_billing", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def traffic(stub: pb_grpc.BillingServiceStub, answered: Answered, stop: asyncio.Event,
                  seed: int, limit: int) -> None:  # fmt: skip
    """Reserve + Settle pairs (retried through crashes) until `stop` or `limit` requests."""
    rng = random.Random(seed)
    deadline = time.monotonic() + 180
    while not stop.is_set() and len(answered) < limit:
        rid = f"p{seed}-{len(answered)}-{rng.randrange(10**9)}"
        tenant, model = rng.choice(["t1", "t2"]), rng.choice(["small", "odd", "big"])
        prompt, completion = rng.randrange(1, 3000), rng.randrange(1, 500)
        reserve = pb.ReserveRequest(
            request_id=rid, tenant_id=tenant, key_id=rng.choice(["", "k"]), model=model,
            prompt_tokens=prompt, max_completion_tokens=completion,
        )  # fmt: skip
        settle = pb.SettleRequest(
            request_id=rid, tenant_id=tenant, prompt_tokens=prompt, completion_tokens=completion
        )
        await call_until_done(
            lambda r=reserve: stub.Reserve(r, timeout=2, wait_for_ready=True), deadline
        )
        reply = await call_until_done(
            lambda s=settle: stub.Settle(s, timeout=2, wait_for_ready=True), deadline
        )
        answered[rid] = (tenant, model, prompt, completion, reply.charged_micros)


def check_rows(url: str, answered: Answered) -> None:
    engine = sa.create_engine(driver_url(url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT request_id, tenant_id, model, prompt_tokens, completion_tokens,"
                    " cost_micros, status FROM usage_records"
                )
            ).all()
    finally:
        engine.dispose()
    assert len(rows) == len(answered)  # the primary key makes the ids unique
    assert {r[0]: tuple(r[1:6]) for r in rows} == answered
    assert {r[6] for r in rows} == {"settled"}
    assert sum(r[3] + r[4] for r in rows) == sum(a[2] + a[3] for a in answered.values())


async def wait_drained(client: redis.asyncio.Redis, prefix: str, timeout_s: float) -> None:
    keys = KeySpace(prefix)
    deadline = time.monotonic() + timeout_s
    while True:
        lengths = [await client.xlen(keys.usage_outbox(t)) for t in ("t1", "t2")]
        if sum(lengths) == 0:
            return
        assert time.monotonic() < deadline, f"outbox not drained: {lengths}"
        await asyncio.sleep(0.1)


async def test_sigkill_mid_run_loses_and_doubles_no_row(
    settings: Settings,
    database_url: str,
    processes: list[subprocess.Popen[bytes]],
    redis_client: redis.asyncio.Redis,
) -> None:
    port = free_port()
    env = store_env(settings, port, database_url)
    processes.append(start(env))
    answered: Answered = {}
    stop = asyncio.Event()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.BillingServiceStub(channel)

    async def crash() -> None:
        while len(answered) < 200:  # noqa: ASYNC110 (polls the workers' progress)
            await asyncio.sleep(0.01)
        processes[-1].kill()  # SIGKILL: rows may be in a batch being written
        processes[-1].wait()
        await asyncio.sleep(0.3)
        processes.append(start(env))

    try:
        await asyncio.gather(crash(), *(traffic(stub, answered, stop, s, 600) for s in range(4)))
    finally:
        await channel.close()
    await wait_drained(redis_client, settings.ledger.key_prefix, 30)
    check_rows(database_url, answered)
    result = cli(env, "reconcile", "--hours", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert " 0 differences" in result.stdout


async def run_outage(
    settings: Settings,
    tmp_path: Path,
    processes: list[subprocess.Popen[bytes]],
    redis_client: redis.asyncio.Redis,
    outage_s: float,
) -> None:
    with private_postgres() as pg, scratch_database(pg.server) as url:
        port = free_port()
        env = store_env(settings, port, url)
        processes.append(start(env))
        answered: Answered = {}
        stop = asyncio.Event()
        backlog_seen = 0
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        stub = pb_grpc.BillingServiceStub(channel)
        keys = KeySpace(settings.ledger.key_prefix)

        async def outage() -> None:
            nonlocal backlog_seen
            while len(answered) < 100:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            await asyncio.to_thread(pg.stop, "fast")
            down_until = time.monotonic() + outage_s
            while time.monotonic() < down_until:
                await asyncio.sleep(0.2)
                lengths = [await redis_client.xlen(keys.usage_outbox(t)) for t in ("t1", "t2")]
                backlog_seen = max(backlog_seen, sum(lengths))
            await asyncio.to_thread(pg.start)
            await asyncio.sleep(1.0)
            stop.set()

        try:
            # Every call must succeed with the database down (no retry budget for failures
            # other than a crash: call_until_done only retries UNAVAILABLE/DEADLINE_EXCEEDED,
            # which billing does not answer for a database outage).
            await asyncio.gather(
                outage(), *(traffic(stub, answered, stop, s, 10**9) for s in range(4))
            )
        finally:
            await channel.close()
        assert backlog_seen > 0  # settles went on while the rows waited in the outbox
        await wait_drained(redis_client, settings.ledger.key_prefix, 60)
        check_rows(url, answered)
        result = cli(env, "reconcile", "--hours", "3")
        assert result.returncode == 0, result.stdout + result.stderr
        assert " 0 differences" in result.stdout
        for process in processes:
            process.kill()
            process.wait()


async def test_database_outage_under_load_loses_nothing(
    settings: Settings,
    tmp_path: Path,
    processes: list[subprocess.Popen[bytes]],
    redis_client: redis.asyncio.Redis,
) -> None:
    outage = float(os.environ.get("BILLING_TEST_DB_OUTAGE_S", "3"))
    await run_outage(settings, tmp_path, processes, redis_client, outage)


@pytest.mark.chaos
@pytest.mark.slow
async def test_database_outage_of_30s_under_load_loses_nothing(
    settings: Settings,
    tmp_path: Path,
    processes: list[subprocess.Popen[bytes]],
    redis_client: redis.asyncio.Redis,
) -> None:
    await run_outage(settings, tmp_path, processes, redis_client, 30.0)
