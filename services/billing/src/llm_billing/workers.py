"""Several billing processes on one port (BILLING_WORKERS): one grpc.aio event loop uses one
core, so a host with more cores runs more workers.

gRPC servers set SO_REUSEPORT, so every worker binds the same GRPC_PORT and the kernel spreads
incoming *connections* across them (a client needs several connections to reach several
workers). Replicas are safe because the ledger lives in Redis and every change is one atomic,
idempotent Lua script. Worker i serves Prometheus metrics on METRICS_PORT + i.

The supervisor only starts and stops: when a worker dies, it stops the others and exits
non-zero, so that the orchestrator restarts the service as a whole.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import signal
from collections.abc import Sequence
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from types import FrameType

from llm_billing.config import Settings
from llm_common.cli import config_errors_exit
from llm_common.config import ConfigError
from llm_common.logging import configure_logging, get_logger

PROGRAM = "llm-billing"
EXIT_WORKER_FAILED = 1
STOP_MARGIN_S = 10.0  # beyond the drain grace, before a worker is killed
_log = get_logger(__name__)


def worker_settings(settings: Settings, index: int) -> Settings:
    """Worker `index`'s settings: the same gRPC port, its own metrics port."""
    metrics_port = settings.server.metrics_port
    if metrics_port:  # None (off) and 0 (ephemeral) are the same for every worker
        metrics_port += index
    server = dataclasses.replace(settings.server, metrics_port=metrics_port)
    return dataclasses.replace(settings, server=server)


def check_workers(settings: Settings) -> None:
    """Several workers need a fixed port to share (port 0 would give each its own)."""
    if settings.workers > 1 and settings.server.grpc_port == 0:
        raise ConfigError.for_variable("BILLING_WORKERS", "needs a fixed GRPC_PORT (not 0)")


def run_worker(settings: Settings) -> None:
    """Entry point of one worker process."""
    with config_errors_exit(PROGRAM):  # e.g. Redis never answered: one line, exit 2
        configure_logging(settings.server.service_name, settings.server.log_level)
        from llm_billing.server import serve  # after logging, as in cli.run

        asyncio.run(serve(settings))


def serve_workers(settings: Settings) -> int:
    """Start `settings.workers` workers, forward SIGTERM/SIGINT, wait; the exit status."""
    check_workers(settings)
    context = multiprocessing.get_context("spawn")  # no forked event loops or gRPC state
    workers = [
        context.Process(target=run_worker, args=(worker_settings(settings, i),), name=f"w{i}")
        for i in range(settings.workers)
    ]
    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if not stopping:  # one SIGTERM each: a second one would cut a worker's drain short
            stopping = True
            _terminate(workers)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for worker in workers:
            worker.start()
        _log.info("workers started", workers=len(workers), port=settings.server.grpc_port)
        wait([w.sentinel for w in workers])  # until a worker exits (or a stop ends them)
        failed = not stopping
        if failed:
            _log.error("a billing worker exited; stopping the others")
            stop(signal.SIGTERM, None)
        _join(workers, settings.server.shutdown_grace_s + STOP_MARGIN_S)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    clean = all(w.exitcode == 0 for w in workers)
    return 0 if clean and not failed else EXIT_WORKER_FAILED


def _terminate(workers: Sequence[BaseProcess]) -> None:
    for worker in workers:
        if worker.is_alive():
            worker.terminate()  # SIGTERM: the worker drains like a single server


def _join(workers: Sequence[BaseProcess], timeout_s: float) -> None:
    for worker in workers:
        worker.join(timeout_s)
        if worker.is_alive():
            _log.warning("worker did not stop in time; killing it", worker=worker.name)
            worker.kill()
            worker.join()
