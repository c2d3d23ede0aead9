"""`make scale` on a running stack: a third replica joins the router's fleet without a
restart and takes traffic; scaling back to 2 unlists it, drains it (exit 0) and requests keep
succeeding. The two catalogue replicas stay, as the other scenarios expect them."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from .conftest import ChaosStack
from .harness import chat, metric_sum, record, until
from .replicas import INFERENCE, WORKERS

pytestmark = pytest.mark.chaos


def _served(metrics_port: int) -> float:
    return metric_sum(f"127.0.0.1:{metrics_port}", "llm_rpc_requests_total", service=INFERENCE,
                      method="Generate", code="OK")  # fmt: skip


def _burst(channel: grpc.Channel, key: str) -> list[str]:
    with ThreadPoolExecutor(WORKERS) as pool:
        texts = [f"scale {uuid.uuid4().hex}" for _ in range(WORKERS)]
        return list(pool.map(lambda t: chat(channel, key, t).code, texts))


def test_scale_out_and_in_on_a_running_stack(chaos_stack: ChaosStack) -> None:
    stack = chaos_stack.stack
    assert stack.scalable is not None
    assert len(stack.scaled_replicas()) == 2
    with grpc.insecure_channel(chaos_stack.edge) as channel:
        addresses = stack.scale(3)
        assert len(addresses) == 3
        newcomer = stack.scaled_replicas()[-1]
        assert stack.scalable.listing.read_text().split() == addresses
        bursts = 0

        def newcomer_served() -> bool:
            nonlocal bursts
            bursts += 1
            assert _burst(channel, chaos_stack.demo_key) == ["OK"] * WORKERS
            return _served(newcomer.spec.metrics_port) > 0

        joined_s = until("the new replica serves", newcomer_served, 90)
        remaining = stack.scale(2)
        assert remaining == addresses[:2]
        assert not newcomer.alive()
        assert newcomer.exit_code() == 0  # drained, not killed
        codes = [c for _ in range(3) for c in _burst(channel, chaos_stack.demo_key)]
        assert codes == ["OK"] * len(codes)
    record("make_scale", {"joined_after_s": round(joined_s, 2), "bursts_until_served": bursts,
                          "requests_after_scale_in": len(codes), "failed": 0})  # fmt: skip
