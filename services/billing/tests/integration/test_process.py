"""`python -m llm_billing` as a process: start-up errors, graceful stop, and a crash (SIGKILL)
and restart in the middle of traffic that loses and double-counts nothing."""

from __future__ import annotations

import asyncio
import contextlib
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
from llm_testing import free_port
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


def wait_serving(channel: grpc.Channel) -> None:
    """Until health says SERVING: the port is open (NOT_SERVING) before Redis is reached."""
    deadline = time.monotonic() + START_TIMEOUT_S
    health = health_pb2_grpc.HealthStub(channel)
    while True:
        reply = health.Check(
            health_pb2.HealthCheckRequest(), timeout=START_TIMEOUT_S, wait_for_ready=True
        )
        if reply.status == health_pb2.HealthCheckResponse.SERVING:
            return
        assert time.monotonic() < deadline, "the billing process never became SERVING"
        time.sleep(0.05)


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
        wait_serving(channel)
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
        charged: int = reply.charged_micros
        assert charged == cost_of(model, prompt, completion // 2)
        return charged

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
        since = timestamp_pb2.Timestamp(seconds=int(started) - 7200)
        until = timestamp_pb2.Timestamp(seconds=int(time.time()) + 7200)
        for tenant in ("t1", "t2"):
            mine = [p for p in plan if p[1] == tenant]
            request = pb.GetUsageRequest(tenant_id=tenant, start_time=since, end_time=until)
            usage = (await stub.GetUsage(request, wait_for_ready=True, timeout=30)).total
            assert usage.requests == len(mine)
            assert usage.cost_micros == sum(cost_of(m, p, c // 2) for _, _, m, p, c in mine)
            assert usage.completion_tokens == sum(c // 2 for *_, c in mine)
    finally:
        await channel.close()


def spawned_workers(pid: int) -> list[int]:
    """The worker processes of a supervisor (its other child is multiprocessing's tracker)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(c) for c in children if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]


def alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def connections(pid: int, port: int) -> int:
    """Established TCP connections on `port` that process `pid` holds (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(FileNotFoundError):  # closed while we look
            link = os.readlink(fd)
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    count = 0
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            established = fields[3] == "01"
            count += established and local_port == port and fields[9] in inodes
    return count


def wait_workers(pid: int, count: int) -> list[int]:
    deadline = time.monotonic() + START_TIMEOUT_S
    while len(workers := spawned_workers(pid)) < count:
        assert time.monotonic() < deadline, "the workers did not start"
        time.sleep(0.05)
    return workers


async def test_workers_share_the_port_and_stop_together(
    settings: Settings,
    processes: list[subprocess.Popen[bytes]],
    redis_client: redis.asyncio.Redis,
    cost_of: Callable[..., int],
) -> None:
    port = free_port()
    process = start({**billing_env(settings, port), "BILLING_WORKERS": "2"})
    processes.append(process)
    workers = wait_workers(process.pid, 2)
    options = [("grpc.use_local_subchannel_pool", 1)]  # one connection per channel
    for _ in range(2 * len(workers)):  # every worker up, not only the first
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as probe:
            wait_serving(probe)
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) for _ in range(16)]
    try:
        stubs = [pb_grpc.BillingServiceStub(c) for c in channels]
        for i, stub in enumerate(stubs * 4):
            rid = f"w{i}"
            await stub.Reserve(
                pb.ReserveRequest(
                    request_id=rid,
                    tenant_id="t1",
                    model="small",
                    prompt_tokens=100 + i,
                    max_completion_tokens=50,
                ),
                timeout=10,
            )
            await stub.Settle(
                pb.SettleRequest(
                    request_id=rid, tenant_id="t1", prompt_tokens=100 + i, completion_tokens=7
                ),
                timeout=10,
            )
        # 16 connections over 2 listeners: the kernel gives each worker some (all 16 on one
        # has odds of 2**-15).
        served = [connections(pid, port) for pid in workers]
        assert sum(served) >= 16, served  # counted from the server side
        assert all(served), served
        now = int(time.time())
        usage = await stubs[0].GetUsage(
            pb.GetUsageRequest(
                tenant_id="t1",
                start_time=timestamp_pb2.Timestamp(seconds=now - 7200),
                end_time=timestamp_pb2.Timestamp(seconds=now + 7200),
            ),
            timeout=10,
        )
        assert usage.total.requests == 64
        assert usage.total.cost_micros == sum(cost_of("small", 100 + i, 7) for i in range(64))
    finally:
        for channel in channels:
            await channel.close()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=START_TIMEOUT_S) == 0
    assert not any(alive(pid) for pid in workers)


def test_a_dead_worker_stops_the_service(
    settings: Settings, processes: list[subprocess.Popen[bytes]], redis_client: Any
) -> None:
    port = free_port()
    process = start({**billing_env(settings, port), "BILLING_WORKERS": "2"})
    processes.append(process)
    first, second = wait_workers(process.pid, 2)
    os.kill(first, signal.SIGKILL)
    assert process.wait(timeout=START_TIMEOUT_S) == 1  # the orchestrator restarts it all
    deadline = time.monotonic() + 5
    while alive(second) and time.monotonic() < deadline:
        time.sleep(0.05)  # reaped by the supervisor just before it exited
    assert not alive(second)


def test_several_workers_on_port_zero_is_a_config_error(settings: Settings) -> None:
    env = {**billing_env(settings, 0), "BILLING_WORKERS": "2"}
    result = subprocess.run(
        [sys.executable, "-m", "llm_billing"],
        env=env,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 2
    assert "BILLING_WORKERS" in result.stderr
