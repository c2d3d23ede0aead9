"""Scenario (c): Redis killed and restarted; the cache is bypassed, known keys still
authenticate, every request is served, and no service crashes."""

from __future__ import annotations

import time
import uuid

import grpc
import pytest

from .conftest import ChaosStack
from .harness import chat, metric_sum

pytestmark = pytest.mark.chaos

OUTAGE_REQUESTS = 6
RECOVERY_TIMEOUT_S = 60.0
SERVICES = ("auth", "tokenizer", "cache", "billing", "router")


def _cache_misses(stack: ChaosStack) -> float:
    router = stack.metrics("router")
    return sum(
        metric_sum(router, "llm_router_cache_lookups_total", result=result)
        for result in ("miss", "error", "bypass")
    )


def _until_ok(stack: ChaosStack, channel: grpc.Channel, key: str, what: str) -> None:
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while (code := chat(channel, key, f"{what} {uuid.uuid4().hex}").code) != "OK":
        assert time.monotonic() < deadline, f"{what}: still {code}"
        time.sleep(0.5)


def _create_key_when_ready(stack: ChaosStack) -> str:
    deadline = time.monotonic() + RECOVERY_TIMEOUT_S
    while True:
        try:
            return stack.create_key(name="after redis", requests_per_minute=0)
        except grpc.RpcError as error:  # auth may still be reconnecting to Redis
            if time.monotonic() > deadline:
                pytest.fail(f"no key could be created after the restart: {error.code()}")
            time.sleep(0.5)


def test_redis_restart_degrades_without_crashes(chaos_stack: ChaosStack) -> None:
    from llm_stack import probes

    redis = chaos_stack.process("redis")
    services = {name: chaos_stack.process(name) for name in SERVICES}
    pids = {name: process.pid for name, process in services.items()}
    with grpc.insecure_channel(chaos_stack.edge) as channel:
        assert chat(channel, chaos_stack.demo_key, "before the outage").code == "OK"  # known now
        misses_before = _cache_misses(chaos_stack)

        redis.kill()  # SIGKILL: the AOF holds what was written up to a second ago
        try:
            outage = [
                chat(channel, chaos_stack.demo_key, f"redis outage {n} {uuid.uuid4().hex}").code
                for n in range(OUTAGE_REQUESTS)
            ]
            assert outage == ["OK"] * OUTAGE_REQUESTS  # the known key still authenticates
            # Every lookup fell through to generation: nothing was served from a dead cache.
            assert _cache_misses(chaos_stack) - misses_before == OUTAGE_REQUESTS
        finally:
            redis.start()
        url = chaos_stack.stack.endpoints.redis_url
        probes.wait_until(
            "redis",
            lambda: probes.redis_ready(url),
            30,
            lambda: None if redis.alive() else "exited",
        )

        _until_ok(chaos_stack, channel, chaos_stack.demo_key, "after the restart")
        # Key administration needs Redis again: a new key is stored and authenticates.
        _until_ok(chaos_stack, channel, _create_key_when_ready(chaos_stack), "new key")

    # No crash loops: every service is still the process that was started, and serving.
    for name, process in services.items():
        assert process.alive(), f"{name} exited: {process.log_tail()}"
        assert process.pid == pids[name], f"{name} was restarted"
        target = f"127.0.0.1:{process.spec.grpc_port}"
        assert probes.grpc_serving(target, process.spec.health_service), f"{name} not serving"
