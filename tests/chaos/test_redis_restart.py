"""Scenario (c): Redis killed and restarted; the cache is bypassed, known keys still
authenticate, rate limits follow the configured failure mode (open: admitted unchecked,
closed: refused), every other request is served, and no service crashes or restarts."""

from __future__ import annotations

import time
import uuid
from collections import Counter

import grpc
import pytest

from .conftest import ChaosStack
from .harness import chat, ejections, metric_sum, record

pytestmark = pytest.mark.chaos

OUTAGE_REQUESTS = 6
RECOVERY_TIMEOUT_S = 60.0
SERVICES = ("auth", "tokenizer", "cache", "billing", "router")
LIMITED_RPM = 2  # a key that is over its limit after two requests
# What auth answers a rate-limited key while Redis is down, by AUTH_RATE_LIMIT_FAILURE_MODE.
OUTAGE_CODE = {"open": "OK", "closed": "RESOURCE_EXHAUSTED"}


def _failure_mode(stack: ChaosStack) -> str:
    """The rate-limit failure mode auth was started with (its documented default: open)."""
    env = stack.process("auth").spec.env
    mode = str(env.get("AUTH_RATE_LIMIT_FAILURE_MODE", "open")).lower()
    assert mode in OUTAGE_CODE, mode
    return mode


def _limit_failures(stack: ChaosStack, mode: str) -> float:
    return metric_sum(stack.metrics("auth"), "llm_auth_rate_limit_store_failures_total", mode=mode)


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
    mode = _failure_mode(chaos_stack)
    limited = chaos_stack.create_key(name="limited", requests_per_minute=LIMITED_RPM)
    with grpc.insecure_channel(chaos_stack.edge) as channel:
        assert chat(channel, chaos_stack.demo_key, "before the outage").code == "OK"  # known now
        # With Redis up the limit holds: the key is over it (and known to auth) before the kill.
        limited_codes = [
            chat(channel, limited, f"limited {n}").code for n in range(LIMITED_RPM + 1)
        ]
        assert limited_codes == ["OK"] * LIMITED_RPM + ["RESOURCE_EXHAUSTED"], limited_codes
        misses_before = _cache_misses(chaos_stack)
        failures_before = _limit_failures(chaos_stack, mode)
        ejected_before = ejections(chaos_stack.stack.endpoints.admin, "auth")

        redis.kill()  # SIGKILL: the AOF holds what was written up to a second ago
        killed_at = time.monotonic()
        try:
            outage = [
                chat(channel, chaos_stack.demo_key, f"redis outage {n} {uuid.uuid4().hex}").code
                for n in range(OUTAGE_REQUESTS)
            ]
            assert outage == ["OK"] * OUTAGE_REQUESTS  # the known key still authenticates
            # Every lookup fell through to generation: nothing was served from a dead cache.
            misses = _cache_misses(chaos_stack) - misses_before
            assert misses == OUTAGE_REQUESTS
            # The over-limit key: let through unchecked (open) or refused (closed), as configured.
            during = chat(channel, limited, "limited during the outage").code
            assert during == OUTAGE_CODE[mode], (mode, during)
            assert _limit_failures(chaos_stack, mode) > failures_before
        finally:
            redis.start()
        outage_s = time.monotonic() - killed_at
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
        recovered_s = time.monotonic() - killed_at - outage_s

    # No crash loops: every service is still the process that was started, and serving.
    restarted = sorted(name for name, process in services.items() if process.pid != pids[name])
    for name, process in services.items():
        assert process.alive(), f"{name} exited: {process.log_tail()}"
        assert process.pid == pids[name], f"{name} was restarted"
        target = f"127.0.0.1:{process.spec.grpc_port}"
        assert probes.grpc_serving(target, process.spec.health_service), f"{name} not serving"
    record(
        "redis_restart",
        {
            "rate_limit_failure_mode": mode,
            "outage_requests": OUTAGE_REQUESTS,
            "outage_codes": dict(Counter(outage)),
            "over_limit_key_before_outage": limited_codes,
            "over_limit_key_during_outage": during,
            "cache_misses_during_outage": misses,
            "outage_s": round(outage_s, 1),
            "recovered_after_restart_s": round(recovered_s, 1),
            "services_restarted": restarted,
            # Auth answers UNAVAILABLE while Redis is down; Envoy may eject it for that.
            "envoy_auth_ejections": ejections(chaos_stack.stack.endpoints.admin, "auth")
            - ejected_before,
        },
    )
