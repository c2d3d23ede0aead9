"""Scenario (b): billing down under load; every request is served, the outbox drains after
recovery, and the ledger equals the usage counted independently from the replies."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from google.protobuf import timestamp_pb2

from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.billing.v1 import billing_service_pb2_grpc as billing_grpc

from .conftest import ChaosStack
from .harness import Outcome, bearer, chat, metric_sum

pytestmark = pytest.mark.chaos

WORKERS = 3
PER_WORKER = 5
SPOOL_TIMEOUT_S = 15.0
DRAIN_TIMEOUT_S = 90.0  # the outbox backs off up to a minute between tries of a dead billing


def _usage(stack: ChaosStack, tenant: str) -> billing_pb.UsageBucket | None:
    """The tenant's total for the last hour; None while billing does not answer."""
    now = int(time.time())
    request = billing_pb.GetUsageRequest(
        tenant_id=tenant,
        start_time=timestamp_pb2.Timestamp(seconds=now - 3600),
        end_time=timestamp_pb2.Timestamp(seconds=now + 3600),
        granularity=billing_pb.GRANULARITY_TOTAL,
    )
    with grpc.insecure_channel(stack.edge) as channel:
        try:
            reply = billing_grpc.BillingServiceStub(channel).GetUsage(
                request, metadata=bearer(stack.admin_key), timeout=10
            )
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.UNAVAILABLE:
                return None
            raise
    total: billing_pb.UsageBucket = reply.total
    return total


def _load(stack: ChaosStack, key: str) -> list[Outcome]:
    with grpc.insecure_channel(stack.edge) as channel:

        def worker(index: int) -> list[Outcome]:
            return [chat(channel, key, f"billing outage {index}-{n}") for n in range(PER_WORKER)]

        with ThreadPoolExecutor(WORKERS) as pool:
            return [o for batch in pool.map(worker, range(WORKERS)) for o in batch]


def test_billing_outage_loses_and_doubles_nothing(chaos_stack: ChaosStack) -> None:
    from llm_stack import probes

    tenant = f"chaos-billing-{uuid.uuid4().hex[:8]}"
    key = chaos_stack.create_key(tenant=tenant, name="billing outage", requests_per_minute=0)
    router = chaos_stack.metrics("router")
    spooled_before = metric_sum(router, "llm_router_settlements_total", outcome="spooled")
    billing = chaos_stack.process("billing")

    def spooled() -> float:
        return metric_sum(router, "llm_router_settlements_total", outcome="spooled")

    billing.kill()  # SIGKILL: no drain
    try:
        outcomes = _load(chaos_stack, key)
        assert _usage(chaos_stack, tenant) is None  # it really was down throughout
        codes = Counter(o.code for o in outcomes)
        assert codes == {"OK": WORKERS * PER_WORKER}, dict(codes)  # fail-open: all served
        # Settlement runs after the answer: each one lands in the outbox shortly after.
        probes.wait_until(
            "usage spooled to the outbox",
            lambda: spooled() - spooled_before >= len(outcomes),
            SPOOL_TIMEOUT_S,
            lambda: None,
        )
    finally:
        billing.start()

    target = f"127.0.0.1:{billing.spec.grpc_port}"
    probes.wait_until(
        "billing",
        lambda: probes.grpc_serving(target, billing.spec.health_service),
        60,
        lambda: None if billing.alive() else "exited",
    )
    expected = (
        len(outcomes),
        sum(o.prompt_tokens for o in outcomes),
        sum(o.completion_tokens for o in outcomes),
    )
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    seen: tuple[int, int, int] | None = None
    while time.monotonic() < deadline:
        total = _usage(chaos_stack, tenant)
        if total is not None:
            seen = (total.requests, total.prompt_tokens, total.completion_tokens)
            assert seen[0] <= expected[0], f"billed more requests than were served: {seen}"
            if seen == expected:
                break
        time.sleep(1.0)
    assert seen == expected, f"ledger {seen} != counted usage {expected}"
    time.sleep(3.0)  # replays still in flight would double-count now
    total = _usage(chaos_stack, tenant)
    assert total is not None
    assert (total.requests, total.prompt_tokens, total.completion_tokens) == expected
