"""bench_router's service processes: spawn, wait until serving, stop; inference and router."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from router_config import MIB, MODEL, ROOT, START_TIMEOUT_S

from llm_common.grpc_runtime import with_grpc_runtime
from llm_testing import free_port


@dataclass
class Proc:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    metrics_port: int | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


def spawn(name: str, args: list[str], env: dict[str, str], logdir: Path, port: int) -> Proc:
    log = (logdir / f"{name}.log").open("wb")
    full_env = with_grpc_runtime(os.environ) | {"PYTHONUNBUFFERED": "1", "METRICS_PORT": "off"}
    full_env |= env
    process = subprocess.Popen(args, env=full_env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    return Proc(name, process, port)


def stop(proc: Proc) -> None:
    code = proc.process.poll()
    if code is not None and code != 0:
        print(f"{proc.name} had exited with {code}", file=sys.stderr)
    if code is None:
        proc.process.send_signal(signal.SIGTERM)
        try:
            proc.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.process.kill()
            proc.process.wait()


async def wait_serving(proc: Proc, logdir: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    async with grpc.aio.insecure_channel(proc.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc.process.poll() is not None:
                tail = (logdir / f"{proc.name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{proc.name} exited with {proc.process.returncode}:\n{tail}")
            with contextlib.suppress(grpc.aio.AioRpcError):
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{proc.name} did not become SERVING in time")


@contextlib.asynccontextmanager
async def running(procs: list[Proc], logdir: Path) -> AsyncIterator[list[Proc]]:
    try:
        await asyncio.gather(*(wait_serving(p, logdir) for p in procs))
        yield procs
    finally:
        for proc in procs:
            stop(proc)


def start_inference(
    logdir: Path, work: Path, name: str, *, prefix_caching: bool, kv_mib: int
) -> Proc:
    port = free_port()
    env = {
        "GRPC_PORT": str(port),
        "INFERENCE_MODEL": MODEL,
        "MODELS_CONFIG": str(work / "models.yaml"),
        "MODEL_ROOT": str(work),
        "INFERENCE_DEVICE": "cpu",
        "INFERENCE_KV_CACHE_BYTES": str(kv_mib * MIB),
        "INFERENCE_MAX_NUM_SEQS": "8",
        "INFERENCE_PREFIX_CACHING": "true" if prefix_caching else "false",
        "REPLICA_ID": name,
        "OMP_NUM_THREADS": "1",
        "LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "WARNING"),
    }
    return spawn(name, [sys.executable, "-m", "llm_inference"], env, logdir, port)


def start_router(
    logdir: Path,
    work: Path,
    name: str,
    deps: dict[str, Any],
    replicas: Sequence[str],
    balancer: str,
    **extra_env: str,
) -> Proc:
    port, metrics_port = free_port(), free_port()
    models = work / f"{name}-models.yaml"
    write_models(models, work / "demo-llama", replicas)
    env = {
        "GRPC_PORT": str(port),
        "MODELS_CONFIG": str(models),
        "MODEL_ROOT": str(work),
        "ROUTER_POLICIES": str(write_policies(work)),
        "TOKENIZER_SERVICE_ADDR": deps["tokenizer"],
        "AUTH_SERVICE_ADDR": deps["auth"],
        "BILLING_SERVICE_ADDR": deps["billing"],
        "CACHE_SERVICE_ADDR": deps.get("cache") or "off",
        "ROUTER_OUTBOX_DIR": str(work / f"{name}-outbox"),
        "ROUTER_BALANCER": balancer,
        "ROUTER_LOAD_INTERVAL_MS": "100",
        "OMP_NUM_THREADS": "1",
        "METRICS_PORT": str(metrics_port),
        **extra_env,
    }
    proc = spawn(name, [sys.executable, "-m", "llm_router"], env, logdir, port)
    proc.metrics_port = metrics_port
    return proc


def metrics_text(metrics_port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
        text: str = reply.read().decode()
    return text


async def wait_attested(router: Proc) -> None:
    """Wait until the tokenizer service attests the router's files (its first poll)."""
    assert router.metrics_port is not None
    wanted = f'llm_router_tokenizer_attested{{model="{MODEL}"}} 1.0'
    deadline = time.monotonic() + START_TIMEOUT_S
    while wanted not in metrics_text(router.metrics_port):
        if time.monotonic() > deadline:
            raise RuntimeError("the tokenizer service never attested the router's files")
        await asyncio.sleep(0.1)


def phase_means_ms(metrics_port: int) -> dict[str, float]:
    """Mean time per router phase, from its Prometheus endpoint."""
    text = metrics_text(metrics_port)
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("llm_router_phase_seconds_sum") or line.startswith(
            "llm_router_phase_seconds_count"
        ):
            name, value = line.rsplit(" ", 1)
            phase = name.split('phase="', 1)[1].split('"', 1)[0]
            (sums if "_sum" in name else counts)[phase] = float(value)
    return {p: round(sums[p] / counts[p] * 1e3, 3) for p in sums if counts.get(p)}


def write_models(path: Path, checkpoint: Path, replicas: Sequence[str]) -> None:
    listed = ", ".join(f'"{r}"' for r in replicas) or '"127.0.0.1:1"'
    path.write_text(
        "tiers: [small, medium, large]\nmodels:\n"
        f"  - name: {MODEL}\n    aliases: [demo]\n    checkpoint: {checkpoint}\n"
        "    context_length: 2048\n    default_max_tokens: 32\n    tier: small\n"
        f"    deployments:\n      - name: bench\n        replicas: [{listed}]\n",
        encoding="utf-8",
    )


def write_policies(work: Path) -> Path:
    # No output rules: nothing is held back, so TTFT is the first token's.
    path = work / "policies.yaml"
    path.write_text("default:\n  output:\n    blocklist: []\n    redact: []\n", encoding="utf-8")
    return path
