"""`python -m llm_billing` as a process: start-up errors, graceful stop, and a crash (SIGKILL)
and restart in the middle of traffic that loses and double-counts nothing."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis.asyncio
from google.protobuf import timestamp_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llm_billing.config import Settings
from llm_common.testing import free_port
from llmapi.billing.v1 import billing_service_pb2 as pb
from llmapi.billing.v1 import billing_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 60
RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def run_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update({"METRICS_PORT": "off", "LOG_LEVEL": "WARNING"})
    env.update(overrides)
    return env


def billing_env(settings: Settings, port: int) -> dict[str, str]:
    return run_env(
        REDIS_URL=settings.redis.url,
        BILLING_KEY_PREFIX=settings.ledger.key_prefix,
        PRICES_CONFIG=str(settings.prices_config),
        GRPC_PORT=str(port),
    )


def start(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "llm_billing"], env=env)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_missing_redis_url_is_one_clear_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "llm_billing"],
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "llm-billing: configuration error: REDIS_URL: is required but not set"
    ]


def test_unreadable_prices_fail_start_up(tmp_path: Path) -> None:
    missing = tmp_path / "prices.yaml"
    result = subprocess.run(
        [sys.executable, "-m", "llm_billing"],
        env=run_env(REDIS_URL="redis://127.0.0.1:1/0", PRICES_CONFIG=str(missing)),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 2
    assert "PRICES_CONFIG" in result.stderr
    assert str(missing) in result.stderr


def test_serves_then_drains_on_sigterm(
    settings: Settings, processes: list[subprocess.Popen[bytes]], redis_client: Any
) -> None:
    port = free_port()
    process = start(billing_env(settings, port))
    processes.append(process)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=START_TIMEOUT_S, wait_for_ready=True
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        prices = pb_grpc.BillingServiceStub(channel).ListPrices(pb.ListPricesRequest(), timeout=5)
        assert {p.model for p in prices.prices} == {"small", "odd", "big"}
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=START_TIMEOUT_S) == 0


async def call_until_done(call: Callable[[], Any], deadline: float) -> Any:
    """Retry an idempotent call through a crash: wait for the server to be back."""
    while True:
        try:
            return await call()
        except grpc.aio.AioRpcError as err:
            if err.code() not in RETRYABLE or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def test_a_crash_and_restart_mid_run_loses_nothing(
    settings: Settings,
    processes: list[subprocess.Popen[bytes]],
    redis_client: redis.asyncio.Redis,
    cost_of: Callable[..., int],
) -> None:
    port, total, workers = free_port(), 1200, 6
    env = billing_env(settings, port)
    processes.append(start(env))
    rng = random.Random(11)
    plan = [
        (f"c{i}", rng.choice(["t1", "t2"]), rng.choice(["small", "odd", "big"]),
         rng.randrange(1, 3000), rng.randrange(1, 500))
        for i in range(total)
    ]  # fmt: skip
    done: list[int] = []
    crashed, third_done = asyncio.Event(), asyncio.Event()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.BillingServiceStub(channel)
    deadline = time.monotonic() + 120

    async def play(rid: str, tenant: str, model: str, prompt: int, completion: int) -> int:
        reserve = pb.ReserveRequest(
            request_id=rid,
            tenant_id=tenant,
            key_id="k",
            model=model,
            prompt_tokens=prompt,
            max_completion_tokens=completion,
        )
        settle = pb.SettleRequest(
            request_id=rid, prompt_tokens=prompt, completion_tokens=completion // 2
        )
        await call_until_done(
            lambda: stub.Reserve(reserve, timeout=2, wait_for_ready=True), deadline
        )
        reply = await call_until_done(
            lambda: stub.Settle(settle, timeout=2, wait_for_ready=True), deadline
        )
        assert reply.charged_micros == cost_of(model, prompt, completion // 2)
        return reply.charged_micros

    async def worker(w: int) -> None:
        for index in range(w, total, workers):
            await play(*plan[index])
            done.append(index)
            if len(done) == total // 3:
                third_done.set()

    async def crash_and_restart() -> None:
        await third_done.wait()
        processes[-1].kill()  # SIGKILL: no drain, calls in flight are cut
        processes[-1].wait()
        crashed.set()
        await asyncio.sleep(0.3)
        processes.append(start(env))

    started = time.time()
    try:
        await asyncio.gather(crash_and_restart(), *(worker(w) for w in range(workers)))
    finally:
        await channel.close()
    assert crashed.is_set()
    assert sorted(done) == list(range(total))

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stub = pb_grpc.BillingServiceStub(channel)
    try:
        window = {
            "start_time": timestamp_pb2.Timestamp(seconds=int(started) - 7200),
            "end_time": timestamp_pb2.Timestamp(seconds=int(time.time()) + 7200),
        }
        for tenant in ("t1", "t2"):
            mine = [p for p in plan if p[1] == tenant]
            request = pb.GetUsageRequest(tenant_id=tenant, **window)
            usage = (await stub.GetUsage(request, wait_for_ready=True, timeout=30)).total
            assert usage.requests == len(mine)
            assert usage.cost_micros == sum(cost_of(m, p, c // 2) for _, _, m, p, c in mine)
            assert usage.completion_tokens == sum(c // 2 for *_, c in mine)
    finally:
        await channel.close()
