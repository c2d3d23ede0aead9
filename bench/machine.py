"""How fast and how steady the machine was while a benchmark ran: figures to read the
benchmark's own numbers against, taken in the same run.

Shared 2-core machines differ from run to run (1.5-2x seen between sessions on the same
code), so a latency goal is only judged fairly next to the floor the machine itself sets:
- `python_ms`: a fixed pure-Python loop (CPU speed as Python code sees it);
- `grpc_unary`: a grpc.aio server with no interceptors and no work (health Check), started
  with the services' gRPC runtime settings (llm_common.grpc_runtime) and called from a
  blocking client in this process: what any Python gRPC hop costs here, p50 and p99;
- `timer_wakeup`: how late a 0.2 ms sleep wakes up (scheduling jitter), p50 and p99;
- `CpuShare`: over a whole run, the share of CPU time the hypervisor gave to other guests
  (`steal` in /proc/stat: on a virtual machine, time this one wanted to run and could not).

Usage: `probe()` -> dict, or `python bench/machine.py` to print it;
`python bench/machine.py serve` is the probe's own server process.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio

from llm_common.grpc_runtime import with_grpc_runtime

LOOP_N = 2_000_000
GRPC_CALLS = 2000
SLEEPS = 2000
SLEEP_S = 0.0002


def python_ms(repeats: int = 5) -> float:
    """Median time of a fixed loop of integer additions, in ms."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        total = 0
        for i in range(LOOP_N):
            total += i
        times.append((time.perf_counter() - started) * 1e3)
    return round(statistics.median(times), 1)


def _quantiles(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)
    return {
        "p50_ms": round(statistics.median(ordered), 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
    }


def timer_wakeup() -> dict[str, float]:
    """Lateness of a 0.2 ms sleep: the scheduler's jitter under whatever else runs."""
    late = []
    for _ in range(SLEEPS):
        started = time.perf_counter()
        time.sleep(SLEEP_S)
        late.append((time.perf_counter() - started - SLEEP_S) * 1e3)
    return _quantiles(late)


async def _serve() -> None:
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health_aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)
    await server.wait_for_termination()


def grpc_unary() -> dict[str, float]:
    """p50/p99 of a bare grpc.aio unary call from a blocking client (another process)."""
    server = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "serve"],
        stdout=subprocess.PIPE,
        env=with_grpc_runtime(os.environ),  # as the services run
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            request = health_pb2.HealthCheckRequest()
            stub.Check(request, wait_for_ready=True, timeout=30)
            for _ in range(200):  # warm the connection and both code paths
                stub.Check(request)
            times = []
            for _ in range(GRPC_CALLS):
                started = time.perf_counter()
                stub.Check(request)
                times.append((time.perf_counter() - started) * 1e3)
    finally:
        server.terminate()
        server.wait(timeout=10)
    return _quantiles(times)


def probe() -> dict[str, Any]:
    """The machine's floors, measured now (the benchmarks record cpus, Python and load)."""
    return {"python_ms": python_ms(), "grpc_unary": grpc_unary(), "timer_wakeup": timer_wakeup()}


class CpuShare:
    """CPU time by kind since construction, from /proc/stat (Linux; empty elsewhere)."""

    _FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")

    def __init__(self) -> None:
        self._start = self._read()

    def _read(self) -> list[int]:
        try:
            first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        except OSError:
            return []
        return [int(v) for v in first[1 : 1 + len(self._FIELDS)]]

    def shares(self) -> dict[str, float]:
        """Each kind's share of all CPU time since construction (steal included)."""
        now = self._read()
        if not now or not self._start:
            return {}
        spent = [b - a for a, b in zip(self._start, now, strict=True)]
        total = sum(spent) or 1
        return {k: round(v / total, 4) for k, v in zip(self._FIELDS, spent, strict=True)}


class Run:
    """Made before a benchmark runs: the probe taken then, and CPU shares from then on."""

    def __init__(self) -> None:
        self.probe = probe()
        self._share = CpuShare()

    def report(self) -> dict[str, Any]:
        return {"probe": self.probe, "cpu_share_during_run": self._share.shares()}


def floor_note(goal_ms: float, floor_ms: float, what: str) -> dict[str, Any]:
    """Whether a latency goal lies below what the machine alone costs for the same path."""
    return {
        "goal_ms": goal_ms,
        "floor_ms": floor_ms,
        "floor_is": what,
        "goal_below_floor": floor_ms > goal_ms,
    }


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        asyncio.run(_serve())
    else:
        about = {"cpus": os.cpu_count(), "python": platform.python_version(), **probe()}
        print(json.dumps(about, indent=2))
