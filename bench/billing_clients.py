"""bench_billing's client processes: each runs the Work it is sent on its own connections."""

from __future__ import annotations

import asyncio
import gc
import multiprocessing
from multiprocessing.connection import Connection
from typing import Any

import grpc
from billing_config import CHANNEL_OPTIONS, RESERVE_BATCH, Pair
from billing_drivers import (
    BatchedPair,
    drive,
    drive_pair_stream,
    drive_settle_only,
    drive_settle_stream,
    grpc_pair,
    router_batcher,
)
from billing_values import Work

from llm_router.clients.billing import BillingClient
from llmapi.billing.v1 import billing_service_pb2_grpc as pb_grpc


async def client_work(work: Work) -> dict[str, Any]:
    """A client process's share, on its own connections (opened before the clock starts)."""
    channels = [
        grpc.aio.insecure_channel(work.target, options=CHANNEL_OPTIONS)
        for _ in range(work.channels)
    ]
    try:
        for channel in channels:
            await asyncio.wait_for(channel.channel_ready(), 30)
        stubs = [pb_grpc.BillingServiceStub(c) for c in channels]
        ids = range(work.first, work.count, work.stride)
        if work.mode == "settle_only":
            return await drive_settle_only(stubs[0], list(ids), work.prefix, work.concurrency)
        if work.mode == "settle_stream":
            billing = BillingClient(channels[0], timeout_s=10, breaker=None)
            return await drive_settle_stream(
                billing, list(ids), work.prefix, work.rate_per_s, work.in_flight
            )
        if work.mode.startswith("pair_stream"):
            shape = RESERVE_BATCH if work.mode == "pair_stream" else None
            billing = BillingClient(channels[0], timeout_s=10, breaker=None, reserve_batch=shape)
            return await drive_pair_stream(
                billing, list(ids), work.prefix, work.rate_per_s, work.in_flight
            )
        if work.mode == "batched":
            billing = BillingClient(channels[0], timeout_s=10, breaker=None)
            pair: Pair = BatchedPair(stubs, router_batcher(billing, work.in_flight))
        else:
            pair = grpc_pair(stubs)
        return await drive(pair, iter(ids), work.prefix, work.concurrency)
    finally:
        for channel in channels:
            await channel.close()


def client_process(conn: Connection) -> None:
    """A benchmark client process: runs each Work it is sent, until None.

    What start-up allocated is frozen out of the cyclic GC, as every service does once it
    serves (llm_common.server): the router's settlement path never walks its whole heap in a
    full collection, so neither does the client standing in for it."""
    gc.freeze()
    while (work := conn.recv()) is not None:
        conn.send(asyncio.run(client_work(work)))


class Clients:
    """Persistent client processes (spawned once: their start-up is not measured)."""

    def __init__(self, count: int) -> None:
        context = multiprocessing.get_context("spawn")
        self._conns: list[Connection] = []
        self._procs = []
        for _ in range(count):
            here, there = context.Pipe()
            proc = context.Process(target=client_process, args=(there,), daemon=True)
            proc.start()
            self._conns.append(here)
            self._procs.append(proc)

    async def run(self, works: list[Work]) -> list[dict[str, Any]]:
        for conn, work in zip(self._conns, works, strict=False):
            conn.send(work)
        loop = asyncio.get_running_loop()
        used = self._conns[: len(works)]
        return list(await asyncio.gather(*(loop.run_in_executor(None, c.recv) for c in used)))

    def close(self) -> None:
        for conn, proc in zip(self._conns, self._procs, strict=True):
            conn.send(None)
            proc.join(30)
