"""`python -m llm_cache` as a process: bad settings exit 2 with one line; it serves with
the real encoder and drains on SIGTERM, ending change feed streams first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llm_testing import free_port
from llmapi.cache.v1 import cache_service_pb2 as pb
from llmapi.cache.v1 import cache_service_pb2_grpc as pb_grpc
from llmapi.common.v1 import common_pb2

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 60


def run_env(**overrides: str) -> dict[str, str]:
    env = {**os.environ, "METRICS_PORT": "off", "LOG_LEVEL": "WARNING", "HF_HUB_OFFLINE": "1"}
    env.update(overrides)
    return env


def run(**overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llm_cache"],
        env=run_env(**overrides),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )


def test_bad_variable_fails_start_up_with_one_line() -> None:
    result = run(CACHE_SEMANTIC_THRESHOLD="1.5")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "llm-cache: configuration error: CACHE_SEMANTIC_THRESHOLD: must be <= 1.0, got 1.5"
    ]


def test_missing_encoder_fails_start_up(tmp_path: Path) -> None:
    result = run(CACHE_ENCODER_DIR=str(tmp_path), GRPC_PORT="0")
    assert result.returncode == 2
    assert "CACHE_ENCODER_DIR" in result.stderr


def test_serves_then_drains_on_sigterm(redis_url: str, redis_prefix: str, redis_client) -> None:
    port = free_port()
    env = run_env(
        GRPC_PORT=str(port),
        REDIS_URL=redis_url,
        CACHE_KEY_PREFIX=redis_prefix,
        CACHE_ENCODER_THREADS="1",
    )
    process = subprocess.Popen([sys.executable, "-m", "llm_cache"], env=env)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = health.Check(
                health_pb2.HealthCheckRequest(), timeout=START_TIMEOUT_S, wait_for_ready=True
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            stub = pb_grpc.CacheServiceStub(channel)
            key = pb.CacheKey(
                tenant_id="t",
                model="m",
                prompt="Hello there",
                sampling=common_pb2.SamplingParams(temperature=0.0),
            )
            response = pb.CachedResponse(text="Hi", finish_reason=common_pb2.FINISH_REASON_STOP)
            assert stub.Store(pb.StoreRequest(key=key, response=response), timeout=10).stored
            found = stub.Lookup(pb.LookupRequest(key=key), timeout=10)
            assert found.kind == pb.HIT_KIND_EXACT
            changes = stub.WatchChanges(pb.WatchChangesRequest(), timeout=START_TIMEOUT_S)
            next(changes)  # live

            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            list(changes)  # ends cleanly (OK), whatever heartbeats were still on their way
            assert process.wait(timeout=START_TIMEOUT_S) == 0
        # The open stream did not hold the drain for its whole grace period (10 s).
        assert time.monotonic() - started < 5
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
