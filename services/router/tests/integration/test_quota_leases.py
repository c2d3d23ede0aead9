"""Token-quota leases against the real auth service and Redis: one reservation covers many
requests, and what auth's bucket is charged in the end is exactly what the requests used."""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
import uuid
from pathlib import Path

import grpc
import pytest
from prometheus_client import CollectorRegistry, Counter

from llm_router.admission.quota_lease import LeaseSettings, QuotaLeases
from llm_router.background import Background
from llm_router.clients.quota import QuotaClient
from llm_router.observability import RouterMetrics
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

from .conftest import (
    MODEL,
    Caller,
    Router,
    Stack,
    deployment,
    router_settings,
    running_router,
    wait_for,
    with_deployments,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

EVENTS = "llm_router_quota_lease_events_total"


@dataclasses.dataclass
class Leasing:
    """QuotaLeases over the stack's auth, as the router builds it."""

    leases: QuotaLeases
    background: Background
    quota: QuotaClient
    events: Counter


def leasing(stack: Stack, settings: LeaseSettings) -> Leasing:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{stack.auth.port}")
    quota = QuotaClient(channel, 5.0, None)
    background = Background()
    events = RouterMetrics(CollectorRegistry()).quota_leases
    made = QuotaLeases(quota, settings, background=background, events=events, refund_timeout_s=5)
    return Leasing(made, background, quota, events)


async def remaining(quota: QuotaClient, caller: Caller) -> int:
    """What the key's bucket holds now (a 1-token probe, counted back in)."""
    grant = await quota.reserve(caller.tenant, caller.key, 1, f"probe-{uuid.uuid4().hex}")
    return int(grant.remaining) + 1


async def test_auth_is_charged_exactly_what_leased_requests_used(stack: Stack) -> None:
    limit = 60_000  # refills 1,000 tokens a second: the check below allows for it
    caller = await stack.tenant(tokens_per_minute=limit)
    it = leasing(stack, LeaseSettings(lease_s=0.2, max_share=0.5))
    leases, background, quota, events = it.leases, it.background, it.quota, it.events
    leases.learn(caller.tenant, caller.key, limit)
    rng = random.Random(5)
    used = 0
    started = time.monotonic()

    async def request() -> int:
        # As the admitter does: from a lease, else a reservation of its own.
        tokens = rng.randint(200, 1500)
        lease = await leases.draw(caller.tenant, caller.key, tokens)
        own = f"r{uuid.uuid4().hex}"
        if lease is None:
            await quota.reserve(caller.tenant, caller.key, tokens, own)
        await asyncio.sleep(rng.uniform(0, 0.05))
        unused = rng.randint(0, tokens)
        if lease is not None:
            leases.release(lease, unused)
        elif unused:
            await quota.refund(caller.tenant, caller.key, own, unused, 5.0)
        return tokens - unused

    for _ in range(4):  # rounds of concurrent requests, across lease expiries
        used += sum(await asyncio.gather(*(request() for _ in range(8))))
        await asyncio.sleep(0.1)
    assert events.labels("drawn")._value.get() >= 16  # most came from leases
    leases.close_all()
    await background.drain(5.0)
    left = await remaining(quota, caller)
    refill = (time.monotonic() - started) * limit / 60 + 1
    # Never more than the limit charged; nothing held back beyond what refilled meanwhile.
    assert limit - used <= left <= min(limit, limit - used + refill)


async def test_a_refused_lease_falls_back_to_exact_reservations(stack: Stack) -> None:
    limit = 1000
    caller = await stack.tenant(tokens_per_minute=limit)
    it = leasing(stack, LeaseSettings(lease_s=5.0, max_share=0.5))
    leases, background, quota = it.leases, it.background, it.quota
    leases.learn(caller.tenant, caller.key, limit)
    await quota.reserve(caller.tenant, caller.key, limit - 60, "most-of-it")
    # A lease holds 4 such requests (120 tokens): more than is left, so auth refuses it ...
    assert await leases.draw(caller.tenant, caller.key, 30) is None
    # ... and the key reserves per request for a while, stranding nothing.
    assert await leases.draw(caller.tenant, caller.key, 30) is None
    assert 30 <= await remaining(quota, caller) <= 60 + 1
    await background.drain(1.0)


async def test_requests_share_one_lease(stack: Stack, tmp_path: Path) -> None:
    catalog = with_deployments(stack.catalog, deployment("d", stack.replica_addrs))
    settings = dataclasses.replace(
        router_settings(stack, tmp_path, cache=False), leases=LeaseSettings(lease_s=0.5)
    )
    caller = await stack.tenant(tokens_per_minute=600_000)
    sampling = common_pb2.SamplingParams(max_tokens=3, ignore_eos=True, temperature=0)

    def chat(text: str, request_id: str = "") -> pb.ChatRequest:
        message = common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)
        return pb.ChatRequest(
            model=MODEL, messages=[message], sampling=sampling, request_id=request_id
        )

    async with running_router(settings, catalog) as router:
        for i in range(4):
            await router.stub.Chat(chat(f"Lease {i}"), metadata=caller.metadata)
        # The first request reserved on its own (and told the router the key's limit); the
        # next three drew from a single lease, sized for four such requests.
        assert events(router, "acquired") == 1
        assert events(router, "drawn") == 3
        # A client's request id keeps its idempotent reservation at auth.
        await router.stub.Chat(chat("Mine", request_id="client-1"), metadata=caller.metadata)
        assert events(router, "drawn") == 3

        async def refunded() -> bool:
            return events(router, "refunded") == 1

        await wait_for(refunded)  # the lease ended: its unused tokens went back to auth


def events(router: Router, event: str) -> float:
    return router.metric(EVENTS, event=event)
