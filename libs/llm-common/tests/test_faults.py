"""LLM_FAULTS parsing, and injected delays and failures on a real server."""

from __future__ import annotations

import math
import random
from collections.abc import AsyncIterator
from dataclasses import replace

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llm_common.config import ConfigError
from llm_common.faults import (
    FAULTS_ENV,
    INJECTED_MESSAGE,
    FaultInterceptor,
    FaultPlan,
    FaultRule,
    fault_interceptors,
    parse_rules,
)
from llm_testing import bytes_service, bytes_stream, bytes_unary, running_server

SERVICE = "test.v1.Echo"
ECHO, WORDS = f"/{SERVICE}/Echo", f"/{SERVICE}/Words"
Context = grpc.aio.ServicerContext[bytes, bytes]


class Echo:
    """Counts the calls that reached the handler, so a test can tell injected from real."""

    def __init__(self) -> None:
        self.calls = 0

    async def echo(self, request: bytes, context: Context) -> bytes:
        self.calls += 1
        return request

    async def words(self, request: bytes, context: Context) -> AsyncIterator[bytes]:
        self.calls += 1
        for word in request.split():
            yield word


class FakeClock:
    """Seconds the test sets by hand; the rule window reads it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _serve(interceptor: FaultInterceptor, echo: Echo) -> AsyncIterator[grpc.aio.Channel]:
    spec = bytes_service(SERVICE, unary={"Echo": echo.echo}, server_streaming={"Words": echo.words})
    # A plain channel: make_channel's retry policy would re-send UNAVAILABLE calls.
    async with (
        running_server(replace(spec, interceptors=(interceptor,))) as server,
        grpc.aio.insecure_channel(server.target) as channel,
    ):
        yield channel


def _interceptor(spec: str, *, seed: int = 7, clock: FakeClock | None = None) -> FaultInterceptor:
    plan = FaultPlan(parse_rules(spec))
    return FaultInterceptor(plan, rng=random.Random(seed), clock=clock or FakeClock())


# --- parsing -------------------------------------------------------------------------------


def test_unset_means_no_interceptor() -> None:
    assert fault_interceptors({}) == []
    assert fault_interceptors({FAULTS_ENV: "  "}) == []


def test_full_rule_is_parsed() -> None:
    environ = {
        FAULTS_ENV: "/llmapi.cache.v1.*:error_rate=0.5,code=resource_exhausted,stop_s=20; "
        "*/Tokenize:delay_ms=300,start_s=5",
        "LLM_FAULTS_SEED": "42",
    }
    plan = FaultPlan.from_env(environ)
    assert plan.seed == 42
    assert plan.rules == (
        FaultRule("/llmapi.cache.v1.*", 0, 0.5, grpc.StatusCode.RESOURCE_EXHAUSTED, 0.0, 20.0),
        FaultRule("*/Tokenize", 300, 0.0, grpc.StatusCode.UNAVAILABLE, 5.0, math.inf),
    )
    assert len(fault_interceptors(environ)) == 1


def test_first_matching_rule_wins_and_probes_are_exempt() -> None:
    plan = FaultPlan(parse_rules("*/Echo:delay_ms=1;*:error_rate=1"))
    rule = plan.rule_for(ECHO)
    assert rule is not None
    assert rule.delay_ms == 1
    other = plan.rule_for(f"/{SERVICE}/Other")
    assert other is not None
    assert other.error_rate == 1.0
    assert plan.rule_for("/grpc.health.v1.Health/Check") is None
    assert plan.rule_for("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo") is None


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("*", "is not '<method glob>:"),
        (":delay_ms=5", "is not '<method glob>:"),
        ("*:", "is not '<method glob>:"),
        ("*:delay_ms", "is not '<key>=<value>'"),
        ("*:delay_ms=", "is not '<key>=<value>'"),
        ("*:jitter=5", "unknown option 'jitter'"),
        ("*:delay_ms=5,delay_ms=6", "repeated"),
        ("*:delay_ms=fast", "must be a number"),
        ("*:delay_ms=1.5", "whole number"),
        ("*:delay_ms=-1", "must be in"),
        ("*:delay_ms=60001", "must be in"),
        ("*:error_rate=1.5", "must be in"),
        ("*:error_rate=nan", "must be in"),
        ("*:error_rate=0.5,code=OK", "other than OK"),
        ("*:error_rate=0.5,code=BROKEN", "other than OK"),
        ("*:error_rate=0.5,start_s=5,stop_s=5", "stop_s must be greater"),
        ("*:error_rate=0,delay_ms=0", "injects nothing"),
        (";".join(["*:delay_ms=1"] * 33), "more than 32 rules"),
        ("*" * 5000 + ":delay_ms=1", "longer than"),
    ],
)
def test_bad_spec_names_the_variable(spec: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        FaultPlan.from_env({FAULTS_ENV: spec})
    assert caught.value.variable == FAULTS_ENV
    assert str(caught.value).startswith(f"{FAULTS_ENV}: ")
    assert fragment in str(caught.value)


def test_bad_seed_names_its_variable() -> None:
    with pytest.raises(ConfigError, match=r"^LLM_FAULTS_SEED: must be an integer"):
        FaultPlan.from_env({FAULTS_ENV: "*:delay_ms=1", "LLM_FAULTS_SEED": "x"})


# --- on a real server ----------------------------------------------------------------------


async def test_every_call_fails_with_the_configured_code_without_running_the_handler() -> None:
    echo = Echo()
    async for channel in _serve(_interceptor("*/Echo:error_rate=1,code=ABORTED"), echo):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await bytes_unary(channel, ECHO)(b"hi", timeout=5)
        assert caught.value.code() == grpc.StatusCode.ABORTED
        assert caught.value.details() == INJECTED_MESSAGE
        words = [w async for w in bytes_stream(channel, WORDS)(b"a b", timeout=5)]
        assert words == [b"a", b"b"]  # Words matches no rule
        assert echo.calls == 1
        # Probes stay truthful even under a catch-all rule's sibling.
        health = health_pb2_grpc.HealthStub(channel)
        reply = await health.Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def _outcomes(channel: grpc.aio.Channel, n: int) -> list[str]:
    codes = []
    for i in range(n):
        try:
            assert await bytes_unary(channel, ECHO)(str(i).encode(), timeout=5) == str(i).encode()
            codes.append("OK")
        except grpc.aio.AioRpcError as error:
            codes.append(error.code().name)
    return codes


async def test_seeded_error_rate_fails_a_reproducible_fraction() -> None:
    runs = []
    for _ in range(2):
        echo = Echo()
        async for channel in _serve(_interceptor("*:error_rate=0.5", seed=3), echo):
            runs.append(await _outcomes(channel, 60))
        assert echo.calls == runs[-1].count("OK")
    assert runs[0] == runs[1]
    assert set(runs[0]) == {"OK", "UNAVAILABLE"}
    draws = random.Random(3)  # one draw per call, in call order
    assert runs[0] == ["UNAVAILABLE" if draws.random() < 0.5 else "OK" for _ in range(60)]
    assert 15 <= runs[0].count("UNAVAILABLE") <= 45


async def test_streaming_call_fails_before_its_first_message() -> None:
    echo = Echo()
    async for channel in _serve(_interceptor("*/Words:error_rate=1"), echo):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            _ = [w async for w in bytes_stream(channel, WORDS)(b"a b", timeout=5)]
        assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
        assert echo.calls == 0


async def test_delay_runs_into_the_callers_deadline() -> None:
    echo = Echo()
    async for channel in _serve(_interceptor("*/Echo:delay_ms=2000"), echo):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await bytes_unary(channel, ECHO)(b"hi", timeout=0.2)
        assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        words = [w async for w in bytes_stream(channel, WORDS)(b"x", timeout=5)]
        assert words == [b"x"]


async def test_rule_applies_only_inside_its_window() -> None:
    clock = FakeClock()
    echo = Echo()
    interceptor = _interceptor("*:error_rate=1,start_s=10,stop_s=20", clock=clock)
    async for channel in _serve(interceptor, echo):
        assert await _outcomes(channel, 1) == ["OK"]
        clock.now += 10
        assert await _outcomes(channel, 2) == ["UNAVAILABLE", "UNAVAILABLE"]
        clock.now += 10  # the faults stop: recovery can be observed without a restart
        assert await _outcomes(channel, 1) == ["OK"]
        assert echo.calls == 2
