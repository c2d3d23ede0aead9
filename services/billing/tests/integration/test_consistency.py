"""10,000 mixed requests from concurrent clients, with random duplicate Reserve/Settle calls:
the ledger must equal an independently computed sum to the micro-unit, and a hard budget
must hold under concurrency."""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import pytest
from google.protobuf import timestamp_pb2

from llm_testing import RunningServer, captured_logs
from llmapi.billing.v1 import billing_service_pb2 as pb
from llmapi.billing.v1 import billing_service_pb2_grpc as pb_grpc
from llmapi.common.v1 import common_pb2

if TYPE_CHECKING:
    Stub = pb_grpc.BillingServiceAsyncStub

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REQUESTS = 10_000
CLIENTS = 8
TENANTS = ("t0", "t1", "t2", "capped")
KEYS = ("k0", "k1", "k2")
MODELS = ("small", "odd", "big")
CAPPED_LIMIT = 2_000_000  # micros, far below the capped tenant's demand
FATES = ("settle",) * 85 + ("release",) * 8 + ("unreserved",) * 7


@dataclass(frozen=True, slots=True)
class Spec:
    rid: str
    tenant: str
    key: str
    model: str
    prompt: int
    max_completion: int
    completion: int
    cached: int
    fate: str
    dup_reserve: bool
    dup_settle: bool


def specs(rng: random.Random) -> list[Spec]:
    out = []
    for i in range(REQUESTS):
        prompt, max_completion = rng.randrange(0, 4000), rng.randrange(1, 1000)
        tenant = rng.choice(TENANTS)
        out.append(
            Spec(
                rid=f"q{i}",
                tenant=tenant,
                key=rng.choice(KEYS),
                model=rng.choice(MODELS),
                prompt=prompt,
                max_completion=max_completion,
                completion=rng.randrange(0, max_completion + 1),
                cached=rng.randrange(0, prompt + 1),
                fate=_fate(rng, tenant),
                dup_reserve=rng.random() < 0.15,
                dup_settle=rng.random() < 0.15,
            )
        )
    return out


def _fate(rng: random.Random, tenant: str) -> str:
    fate = rng.choice(FATES)
    # Usage admitted without a reservation (billing was down) is recorded whatever the
    # budget says, so the hard-limit check uses reserved traffic only.
    return "settle" if tenant == "capped" and fate == "unreserved" else fate


def ts(seconds: float) -> timestamp_pb2.Timestamp:
    return timestamp_pb2.Timestamp(seconds=int(seconds))


async def twice(dup: bool, call: Callable[[], Any]) -> list[Any]:
    """The call, and when `dup` a concurrent duplicate of it; errors are returned."""
    return await asyncio.gather(*(call() for _ in range(2 if dup else 1)), return_exceptions=True)


class Client:
    """Plays requests against one channel and records what should be billed."""

    def __init__(self, stub: Stub) -> None:
        self.stub = stub
        self.charged: list[Spec] = []
        self.refused = 0

    async def play(self, s: Spec) -> None:
        if s.fate == "unreserved":
            await self._settle(s, unreserved=True)
            return
        reserve = pb.ReserveRequest(
            request_id=s.rid,
            tenant_id=s.tenant,
            key_id=s.key,
            model=s.model,
            prompt_tokens=s.prompt,
            max_completion_tokens=s.max_completion,
        )
        results = await twice(s.dup_reserve, lambda: self.stub.Reserve(reserve))
        if not any(isinstance(r, pb.ReserveResponse) for r in results):
            assert all(_code(r) == grpc.StatusCode.RESOURCE_EXHAUSTED for r in results), results
            assert s.tenant == "capped"
            self.refused += 1
            return
        if s.fate == "release":
            release = pb.ReleaseRequest(request_id=s.rid)
            replies = await twice(s.dup_settle, lambda: self.stub.Release(release))
            assert sum(r.released for r in replies) == 1
            return
        await self._settle(s, unreserved=False)

    async def _settle(self, s: Spec, *, unreserved: bool) -> None:
        request = pb.SettleRequest(
            request_id=s.rid,
            prompt_tokens=s.prompt,
            completion_tokens=s.completion,
            cached_tokens=s.cached,
            finish_reason=common_pb2.FINISH_REASON_STOP,
        )
        if unreserved:
            request.tenant_id, request.key_id, request.model = s.tenant, s.key, s.model
        elif random.random() < 0.5:
            request.tenant_id = s.tenant  # the fast path; the other half looks it up
        replies = await twice(s.dup_settle, lambda: self.stub.Settle(request))
        assert sorted(r.duplicate for r in replies) == [False, True][: len(replies)]
        assert len({r.charged_micros for r in replies}) == 1
        self.charged.append(s)


def _code(result: object) -> grpc.StatusCode | None:
    return result.code() if isinstance(result, grpc.aio.AioRpcError) else None


async def set_budget(stub: Stub, tenant: str, hard: int) -> None:
    budget = pb.Budget(tenant_id=tenant, period=pb.BUDGET_PERIOD_TOTAL, hard_limit_micros=hard)
    await stub.SetBudget(pb.SetBudgetRequest(budget=budget))


@pytest.fixture
def quiet_logs() -> Iterator[None]:
    """Access-log lines for 20,000+ RPCs would dominate the run; keep warnings only."""
    with captured_logs(level="WARNING") as logs:
        yield
    assert not [r for r in logs.records() if r.get("level") in ("error", "critical")]


async def test_ten_thousand_mixed_requests_match_an_independent_sum(
    quiet_logs: None, server: RunningServer, cost_of: Callable[..., int]
) -> None:
    started = time.time()
    control = pb_grpc.BillingServiceStub(server.channel)
    for tenant in TENANTS:
        await set_budget(control, tenant, CAPPED_LIMIT if tenant == "capped" else 0)
    queue: asyncio.Queue[Spec] = asyncio.Queue()
    for spec in specs(random.Random(2024)):
        queue.put_nowait(spec)
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") for _ in range(CLIENTS)]
    clients = [Client(pb_grpc.BillingServiceStub(channel)) for channel in channels]
    seen: list[tuple[int, int]] = []
    watcher = asyncio.create_task(watch_capped(control, seen))
    try:
        await asyncio.gather(*(drain(queue, client) for client in clients))
    finally:
        watcher.cancel()
        for channel in channels:
            await channel.close()
    assert seen
    assert all(spent + held <= CAPPED_LIMIT for spent, held in seen), max(seen)

    charged = [s for client in clients for s in client.charged]
    assert sum(c.refused for c in clients) > 0  # the capped tenant did hit its limit
    window = {"start_time": ts(started - 7200), "end_time": ts(time.time() + 7200)}
    await check_usage(control, charged, window, cost_of)
    await check_budgets(control, charged, cost_of)
    await check_export(control, charged, window, cost_of)


async def drain(queue: asyncio.Queue[Spec], client: Client) -> None:
    while not queue.empty():
        await client.play(queue.get_nowait())


async def watch_capped(stub: Stub, seen: list[tuple[int, int]]) -> None:
    """Samples the capped tenant's (spent, held) while traffic runs."""
    while True:
        budget = (await stub.GetBudget(pb.GetBudgetRequest(tenant_id="capped"))).budget
        seen.append((budget.spent_micros, budget.reserved_micros))
        await asyncio.sleep(0.05)


def expected_totals(
    charged: list[Spec], cost_of: Callable[..., int]
) -> dict[tuple[str, str, str], list[int]]:
    """(tenant, key, model) -> [requests, prompt, completion, cached, cost], each filter
    combination (empty = any) summed separately."""
    sums: dict[tuple[str, str, str], list[int]] = {}
    for s in charged:
        row = [
            1,
            s.prompt,
            s.completion,
            s.cached,
            cost_of(s.model, s.prompt, s.completion, s.cached),
        ]
        for key in (s.key, ""):
            for model in (s.model, ""):
                total = sums.setdefault((s.tenant, key, model), [0] * 5)
                for i, value in enumerate(row):
                    total[i] += value
    return sums


async def check_usage(
    stub: Stub, charged: list[Spec], window: dict[str, Any], cost_of: Callable[..., int]
) -> None:
    expected = expected_totals(charged, cost_of)
    for tenant in TENANTS:
        for key in ("", *KEYS):
            for model in ("", *MODELS):
                request = pb.GetUsageRequest(tenant_id=tenant, key_id=key, model=model, **window)
                t = (await stub.GetUsage(request)).total
                got = [
                    t.requests,
                    t.prompt_tokens,
                    t.completion_tokens,
                    t.cached_tokens,
                    t.cost_micros,
                ]
                assert got == expected.get((tenant, key, model), [0] * 5), (tenant, key, model)


async def check_budgets(stub: Stub, charged: list[Spec], cost_of: Callable[..., int]) -> None:
    for tenant in TENANTS:
        budget = (await stub.GetBudget(pb.GetBudgetRequest(tenant_id=tenant))).budget
        expected = sum(
            cost_of(s.model, s.prompt, s.completion, s.cached)
            for s in charged
            if s.tenant == tenant
        )
        assert (budget.spent_micros, budget.reserved_micros) == (expected, 0), tenant
        if tenant == "capped":
            assert budget.spent_micros <= CAPPED_LIMIT


async def check_export(
    stub: Stub, charged: list[Spec], window: dict[str, Any], cost_of: Callable[..., int]
) -> None:
    lines = [m.line async for m in stub.ExportUsage(pb.ExportUsageRequest(**window))]
    rows = [line.split(",") for line in lines[1:]]
    ids = Counter(row[0] for row in rows)
    assert len(ids) == len(rows) == len(charged)  # one line per billed request
    by_id = {s.rid: s for s in charged}
    for row in rows:
        s = by_id[row[0]]
        assert row[1:4] == [s.tenant, s.key, s.model]
        assert int(row[10]) == cost_of(s.model, s.prompt, s.completion, s.cached)
