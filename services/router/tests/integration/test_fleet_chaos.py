"""Fleet resilience scenarios (make test-chaos; make bench-fleet runs them longer): replica
processes found by DNS, a router discovering them, steady streaming load.

scale_out_in: 2 -> 4 -> 1 replicas under load, no failed request. mid_stream_migration:
replicas SIGKILLed while streams run; every cut stream completes token-identical to its
unbroken run, and billing counts what the client received. drain: a rolling restart
(SIGTERM, drain, start again) of every replica under load, no failed request."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from llm_common.models_config import Deployment
from llm_router.routing.load import Health
from llm_router.routing.settings import RoutingSettings
from llm_testing import free_port
from llmapi.common.v1 import common_pb2

from .conftest import (
    Router,
    Stack,
    billed,
    router_settings,
    running_router,
    wait_for,
    with_deployments,
)
from .fleet import Load, Records, Replica, StreamResult, dns_deployment, dns_server, stream_chat
from .fleet import percentile as pct
from .fleet_report import RESULTS, plot, record, timeline

pytestmark = [pytest.mark.integration, pytest.mark.chaos, pytest.mark.asyncio(loop_scope="session")]
ROUTING = RoutingSettings(
    load_interval_ms=100, load_stale_s=2.0, retry_base_s=0.02, retry_jitter_s=0.02,
    exclude_s=1.0, exclude_max_s=4.0,
)  # fmt: skip
HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
PLOTS: dict[str, tuple[dict[str, Any], list[tuple[float, str]]]] = {}


@pytest.fixture(autouse=True)
def only_when_asked(request: pytest.FixtureRequest) -> None:
    if "chaos" not in (request.config.option.markexpr or ""):
        pytest.skip("fleet scenarios run only with -m chaos (make test-chaos, make bench-fleet)")


@pytest.fixture
def phase_s() -> float:
    """Seconds of load per phase: short for make test-chaos, longer for make bench-fleet."""
    return float(os.environ.get("FLEET_PHASE_S", "4"))


@dataclass
class Fleet:
    router: Router
    records: Records
    deployment: Deployment
    replicas: list[Replica]
    metadata: Any

    def members(self) -> set[str]:
        return set(self.router.runtime.discovery.fleet.replicas(self.deployment))

    async def until_members(self, *replicas: Replica, timeout_s: float = 30.0) -> float:
        want = {r.address for r in replicas}
        started = time.monotonic()
        while self.members() != want:
            assert time.monotonic() - started < timeout_s, f"{self.members()} != {want}"
            await asyncio.sleep(0.05)
        return time.monotonic() - started

    async def until_fresh(self, replica: Replica) -> None:
        """Until the router has a load report from `replica` that does not say draining."""
        board = self.router.runtime.board
        await wait_for(lambda: holds(board.health(replica.address) == Health.FRESH), 30)

    def publish(self, *replicas: Replica) -> None:
        self.records.addresses = [r.host for r in replicas]

    async def start(self, *replicas: Replica) -> None:
        for replica in replicas:
            replica.start()
        await asyncio.gather(*(asyncio.to_thread(r.wait_serving) for r in replicas))


@contextlib.asynccontextmanager
async def fleet(stack: Stack, tmp_path: Path, tenant: Any) -> AsyncIterator[Fleet]:
    port = free_port()
    catalog_path = stack.workdir / "models.yaml"
    replicas = [Replica(host, port, catalog_path) for host in HOSTS]
    with dns_server() as (records, dns_port):
        deployment = dns_deployment(dns_port, port)
        catalog = with_deployments(stack.catalog, deployment)
        try:
            settings = router_settings(stack, tmp_path, routing=ROUTING)
            async with running_router(settings, catalog) as router:
                yield Fleet(router, records, deployment, replicas, tenant.metadata)
        finally:
            for replica in replicas:
                replica.kill()


async def holds(condition: bool) -> bool:
    """A condition as wait_for's async predicate (it is re-evaluated on each poll)."""
    return condition


def routed_to(router: Router, replica: str) -> float:
    return sum(
        float(s.value)
        for m in router.registry.collect()
        if m.name == "llm_router_routing_decisions"
        for s in m.samples
        if s.name.endswith("_total") and s.labels.get("replica") == replica
    )


async def test_scale_out_and_in_under_load(stack: Stack, tmp_path: Path, phase_s: float) -> None:
    tenant = await stack.tenant()
    async with fleet(stack, tmp_path, tenant) as f:
        a, b, c, d = f.replicas
        await f.start(a, b)
        f.publish(a, b)
        await f.until_members(a, b)
        origin = time.monotonic()
        load = Load(f.router, f.metadata)
        load.start()
        await asyncio.sleep(phase_s)
        await f.start(c, d)
        appeared = time.monotonic()
        f.publish(a, b, c, d)
        await f.until_members(a, b, c, d)
        while routed_to(f.router, c.address) == 0 or routed_to(f.router, d.address) == 0:
            assert time.monotonic() - appeared < 30, "a new replica got no request"
            await asyncio.sleep(0.02)
        first_request_s = time.monotonic() - appeared
        await asyncio.sleep(phase_s)
        shrink = time.monotonic()
        f.publish(a)
        await f.until_members(a)
        for gone in (b, c, d):
            gone.terminate()  # drains: running streams finish, no new ones arrive
        codes = await asyncio.gather(*(asyncio.to_thread(r.wait_exit) for r in (b, c, d)))
        await asyncio.sleep(phase_s)
        await load.stop()
    assert codes == [0, 0, 0]
    assert load.failed == []
    figures = {
        "requests": len(load.outcomes),
        "failed": len(load.failed),
        "replicas": [2, 4, 1],
        "first_request_after_appearing_s": round(first_request_s, 3),
        "tokens_per_s": {
            "2_replicas": round(load.tokens_per_second(origin, appeared), 1),
            "4_replicas": round(load.tokens_per_second(appeared + first_request_s, shrink), 1),
            "1_replica": round(load.tokens_per_second(shrink, time.monotonic()), 1),
        },
    }
    record("resilience.json", "scale_out_in", figures)
    record("fleet.json", "scale_out_in", figures | {"timeline": timeline(load.outcomes, origin)})
    PLOTS["scale_out_in"] = (
        timeline(load.outcomes, origin),
        [(appeared - origin, "2->4"), (shrink - origin, "4->1")],
    )


SAMPLINGS = [
    common_pb2.SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True, logprobs=True),
    common_pb2.SamplingParams(
        temperature=0.9, top_k=40, seed=7, max_tokens=48, ignore_eos=True, logprobs=True
    ),
    common_pb2.SamplingParams(
        temperature=0.0, max_tokens=48, ignore_eos=True, logprobs=True, frequency_penalty=0.4
    ),
    common_pb2.SamplingParams(
        temperature=1.1, seed=99, max_tokens=48, ignore_eos=True, logprobs=True
    ),
]


async def test_replicas_killed_mid_stream(stack: Stack, tmp_path: Path) -> None:
    tenant = await stack.tenant()
    async with fleet(stack, tmp_path, tenant) as f:
        a, b, c, _ = f.replicas
        await f.start(a, b, c)
        f.publish(a)
        await f.until_members(a)
        texts = [f"stream {i}: a long answer please" for i in range(len(SAMPLINGS))]
        unbroken = [
            await stream_chat(f.router, f.metadata, t, 48, s)
            for t, s in zip(texts, SAMPLINGS, strict=True)
        ]
        # Every stream starts on a, the only replica; b joins; a is killed mid-stream; the
        # streams move to b, which is killed in turn; c finishes them.
        progress = [0] * len(SAMPLINGS)

        def tick(i: int) -> Any:
            return lambda: progress.__setitem__(i, progress[i] + 1)

        runs = [
            asyncio.ensure_future(stream_chat(f.router, f.metadata, t, 48, s, tick(i)))
            for i, (t, s) in enumerate(zip(texts, SAMPLINGS, strict=True))
        ]
        await wait_for(lambda: holds(min(progress) >= 3), 60, 0.005)
        f.publish(a, b)
        await f.until_members(a, b)
        a.kill()
        f.publish(b, c)
        await f.until_members(b, c)
        mark = list(progress)
        await wait_for(
            lambda: holds(
                all(p >= m + 3 or r.done() for p, m, r in zip(progress, mark, runs, strict=True))
            ),
            60,
            0.005,
        )
        b.kill()
        cut: list[StreamResult] = await asyncio.gather(*runs)
        migrations = f.router.metric(
            "llm_router_migrations_total", model="demo-llama", outcome="resumed"
        )
    received = sum(o.tokens for o in unbroken + cut)
    usage = await billed(stack, tenant.tenant, requests=2 * len(SAMPLINGS))
    identical = sum(
        (c.token_ids, c.text) == (u.token_ids, u.text) for c, u in zip(cut, unbroken, strict=True)
    )
    completed = sum(c.code == "OK" and c.finish == "LENGTH" for c in cut)
    figures = {
        "streams_cut": len(cut),
        "streams_completed": completed,
        "identical_to_unbroken": identical,
        "tokens_billed_equal_tokens_received": usage.completion_tokens == received,
        "migrations": int(migrations),
        "largest_gap_ms": {
            "migrated_p50": round(1e3 * pct([c.largest_gap_s for c in cut], 0.5), 1),
            "migrated_p99": round(1e3 * pct([c.largest_gap_s for c in cut], 0.99), 1),
            "unbroken_p50": round(1e3 * pct([u.largest_gap_s for u in unbroken], 0.5), 1),
            "unbroken_p99": round(1e3 * pct([u.largest_gap_s for u in unbroken], 0.99), 1),
        },
    }
    record("resilience.json", "mid_stream_migration", figures)
    record("fleet.json", "mid_stream_migration", figures)
    assert completed == identical == len(cut)
    assert usage.completion_tokens == received
    assert migrations >= len(cut)


async def test_rolling_restart_under_load(stack: Stack, tmp_path: Path, phase_s: float) -> None:
    tenant = await stack.tenant()
    async with fleet(stack, tmp_path, tenant) as f:
        a, b, _, _ = f.replicas
        await f.start(a, b)
        f.publish(a, b)
        await f.until_members(a, b)
        origin = time.monotonic()
        load = Load(f.router, f.metadata)
        load.start()
        await asyncio.sleep(phase_s)
        rolling = time.monotonic()
        events = [(rolling - origin, "roll")]
        for replica, other in ((a, b), (b, a)):
            replica.terminate()  # NOT_SERVING + draining at once; the pod leaves DNS
            f.publish(other)
            assert await asyncio.to_thread(replica.wait_exit) == 0
            await f.start(replica)
            f.publish(a, b)
            await f.until_members(a, b)
            await f.until_fresh(replica)
        rolled = time.monotonic()
        events.append((rolled - origin, "rolled"))
        await asyncio.sleep(phase_s)
        await load.stop()
    assert load.failed == []
    figures = {
        "requests": len(load.outcomes),
        "failed": len(load.failed),
        "replicas_restarted": 2,
        "rolling_restart_s": round(rolled - rolling, 2),
        "tokens_per_s": {
            "steady": round(load.tokens_per_second(origin, rolling), 1),
            "during_rolling_restart": round(load.tokens_per_second(rolling, rolled), 1),
        },
    }
    record("resilience.json", "drain", figures)
    record("fleet.json", "rolling_restart", figures | {"timeline": timeline(load.outcomes, origin)})
    PLOTS["rolling_restart"] = (timeline(load.outcomes, origin), events)
    if len(PLOTS) == 2:
        plot(RESULTS / "fleet.png", PLOTS)
