"""bench_billing's load drivers: closed-loop pairs, SettleBatch calls and open loops."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from billing_config import BATCH_MAX, BATCH_WAIT_S, MODEL, STOP, TENANTS, Pair

from llm_billing.ledger_values import ReserveInput, SettleInput, Usage
from llm_billing.server import Billing
from llm_router.clients.billing import BillingClient, SettleBatcher
from llmapi.billing.v1 import billing_service_pb2 as pb
from llmapi.billing.v1 import billing_service_pb2_grpc as pb_grpc


async def drive(pair: Pair, ids: Iterator[int], prefix: str, concurrency: int) -> dict[str, Any]:
    """Pairs for the request ids in `ids` from `concurrency` coroutines; latencies in ms."""
    out: dict[str, Any] = {"reserve": [], "settle": [], "pair": []}

    async def worker(w: int) -> None:
        tenant = f"bench{w % TENANTS}"
        for i in ids:
            start = time.perf_counter()
            reserve_s, settle_s = await pair(f"{prefix}-{i}", tenant)
            out["pair"].append((time.perf_counter() - start) * 1e3)
            out["reserve"].append(reserve_s * 1e3)
            out["settle"].append(settle_s * 1e3)

    out["start"] = time.perf_counter()  # CLOCK_MONOTONIC: comparable across processes
    cpu = time.process_time()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    if isinstance(pair, BatchedPair):  # its settles in flight count in the elapsed time
        await pair.finish()
        out["settle"], out["settle_calls"] = pair.settles_ms, pair.batcher.batches_sent
    out["end"], out["cpu_s"] = time.perf_counter(), time.process_time() - cpu
    return out


def grpc_pair(stubs: list[pb_grpc.BillingServiceAsyncStub]) -> Pair:
    turn = iter(range(1 << 62))

    async def pair(rid: str, tenant: str) -> tuple[float, float]:
        stub = stubs[next(turn) % len(stubs)]
        t0 = time.perf_counter()
        await stub.Reserve(reserve_request(rid, tenant), timeout=10)
        t1 = time.perf_counter()
        await stub.Settle(settle_request(rid, tenant), timeout=10)
        return t1 - t0, time.perf_counter() - t1

    return pair


def reserve_request(rid: str, tenant: str) -> pb.ReserveRequest:
    return pb.ReserveRequest(
        request_id=rid,
        tenant_id=tenant,
        key_id="key1",
        model=MODEL,
        prompt_tokens=700,
        max_completion_tokens=256,
    )


def settle_request(rid: str, tenant: str) -> pb.SettleRequest:
    return pb.SettleRequest(
        request_id=rid,
        tenant_id=tenant,  # what the router sends: no owner lookup needed
        prompt_tokens=700,
        completion_tokens=180,
        cached_tokens=128,
        finish_reason=STOP,
    )


class BatchedPair:
    """Reserve unary, then the settle queued for a SettleBatch in the background, as the
    router does: the next Reserve does not wait for it. A settle's time is its queue wait
    plus its batch call; `drive` waits for every settle (`finish`) before it stops the clock."""

    def __init__(
        self, stubs: list[pb_grpc.BillingServiceAsyncStub], batcher: SettleBatcher
    ) -> None:
        self._stubs = stubs
        self.batcher = batcher
        self._turn = iter(range(1 << 62))
        self._pending: set[asyncio.Task[None]] = set()
        self.settles_ms: list[float] = []

    async def _settle(self, rid: str, tenant: str) -> None:
        t0 = time.perf_counter()
        await self.batcher.submit(settle_request(rid, tenant))
        self.settles_ms.append((time.perf_counter() - t0) * 1e3)

    async def finish(self) -> None:
        if self._pending:
            await asyncio.wait(set(self._pending))

    async def __call__(self, rid: str, tenant: str) -> tuple[float, float]:
        stub = self._stubs[next(self._turn) % len(self._stubs)]
        t0 = time.perf_counter()
        await stub.Reserve(reserve_request(rid, tenant), timeout=10)
        task = asyncio.get_running_loop().create_task(self._settle(rid, tenant))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)
        return time.perf_counter() - t0, 0.0


async def drive_settle_only(
    stub: pb_grpc.BillingServiceAsyncStub, ids: list[int], prefix: str, in_flight: int
) -> dict[str, Any]:
    """SettleBatch calls of BATCH_MAX pre-reserved requests, `in_flight` at a time."""
    chunks = iter(range(0, len(ids), BATCH_MAX))
    out: dict[str, Any] = {"reserve": [], "settle": [], "pair": [], "settles": len(ids)}

    async def worker() -> None:
        for start in chunks:
            items = [
                pb.SettleBatchItem(settle=settle_request(f"{prefix}-{i}", f"bench{i % TENANTS}"))
                for i in ids[start : start + BATCH_MAX]
            ]
            t0 = time.perf_counter()
            reply = await stub.SettleBatch(pb.SettleBatchRequest(items=items), timeout=10)
            out["settle"].append((time.perf_counter() - t0) * 1e3)
            if any(r.status.code for r in reply.results):
                raise RuntimeError("a settle of the benchmark was refused")

    out["start"] = time.perf_counter()
    cpu = time.process_time()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    out["end"], out["cpu_s"] = time.perf_counter(), time.process_time() - cpu
    return out


async def open_loop(
    ids: list[int], rate_per_s: float, call: Callable[[int, float], Awaitable[None]]
) -> tuple[float, float, float]:
    """Starts `call(i, due)` for each id at `rate_per_s` whatever is still in flight, and
    waits for all of them; (start, end, CPU seconds). The first error is raised at the end."""
    # Completion is counted down, not gathered: gathering thousands of tasks at the end takes
    # the loop for milliseconds while the last calls are still waiting for their answers.
    pending, all_done = len(ids), asyncio.Event()
    tasks: set[asyncio.Task[None]] = set()
    errors: list[Exception] = []

    async def one(i: int, due: float) -> None:
        nonlocal pending
        try:
            await call(i, due)
        except Exception as exc:  # raised below, once every call has ended
            errors.append(exc)
        finally:
            pending -= 1
            if not pending:
                all_done.set()

    start = time.perf_counter()
    cpu = time.process_time()
    for n, i in enumerate(ids):
        due = start + n / rate_per_s
        if (delay := due - time.perf_counter()) > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(i, due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if ids:
        await all_done.wait()
    if errors:
        raise errors[0]
    return start, time.perf_counter(), time.process_time() - cpu


def router_batcher(billing: BillingClient, in_flight: int) -> SettleBatcher:
    """The router's SettleBatcher, as ROUTER_SETTLE_BATCH_* set it by default."""
    return SettleBatcher(
        billing.settle_batch,
        max_items=BATCH_MAX,
        wait_s=BATCH_WAIT_S,
        timeout_s=10,
        max_in_flight=in_flight,
    )


async def drive_settle_stream(
    billing: BillingClient, ids: list[int], prefix: str, rate_per_s: float, in_flight: int
) -> dict[str, Any]:
    """Open loop, as the router's settlements arrive: settles of pre-reserved requests
    submitted at `rate_per_s` to the router's SettleBatcher. A settle's latency counts from
    when it was due, so a client that falls behind does not hide the wait."""
    batcher = router_batcher(billing, in_flight)
    out: dict[str, Any] = {"reserve": [], "settle": [], "pair": [], "settles": len(ids)}

    async def settle(i: int, due: float) -> None:
        await batcher.submit(settle_request(f"{prefix}-{i}", f"bench{i % TENANTS}"))
        out["settle"].append((time.perf_counter() - due) * 1e3)

    out["start"], out["end"], out["cpu_s"] = await open_loop(ids, rate_per_s, settle)
    out["settle_calls"] = batcher.batches_sent
    return out


async def drive_pair_stream(
    billing: BillingClient, ids: list[int], prefix: str, rate_per_s: float, in_flight: int
) -> dict[str, Any]:
    """Open loop of whole requests, as the router meets them under load: at `rate_per_s`,
    each one's Reserve through `billing` (on the request's path), then its settle through
    the router's SettleBatcher. Reserve latency counts from when the request was due; settle
    latency from when it was submitted; a pair's from due to the settle's answer."""
    batcher = router_batcher(billing, in_flight)
    out: dict[str, Any] = {"reserve": [], "settle": [], "pair": [], "settles": len(ids)}

    async def pair(i: int, due: float) -> None:
        rid, tenant = f"{prefix}-{i}", f"bench{i % TENANTS}"
        await billing.reserve(reserve_request(rid, tenant))
        reserved = time.perf_counter()
        await batcher.submit(settle_request(rid, tenant))
        settled = time.perf_counter()
        out["reserve"].append((reserved - due) * 1e3)
        out["settle"].append((settled - reserved) * 1e3)
        out["pair"].append((settled - due) * 1e3)

    out["start"], out["end"], out["cpu_s"] = await open_loop(ids, rate_per_s, pair)
    out["settle_calls"] = batcher.batches_sent
    return out


def direct_pair(billing: Billing) -> Pair:
    async def pair(rid: str, tenant: str) -> tuple[float, float]:
        t0 = time.perf_counter()
        await billing.ledger.reserve(ReserveInput(rid, tenant, "key1", MODEL, 700, 256))
        t1 = time.perf_counter()
        await billing.ledger.settle(SettleInput(rid, tenant, Usage(700, 180, 128, STOP)))
        return t1 - t0, time.perf_counter() - t1

    return pair
