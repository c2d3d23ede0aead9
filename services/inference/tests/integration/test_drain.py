"""Graceful drain of a real `python -m llm_inference` process on SIGTERM: NOT_SERVING and
`draining` in WatchLoad at once, no new work, running streams finish within the grace period
(or are handed back with finish ERROR just before it ends), then the process exits 0."""

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
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as pb
from llmapi.inference.v1 import inference_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration
START_TIMEOUT_S = 60


def start(
    demo_model_dir: Path, tmp_path: Path, grace_s: float
) -> tuple[subprocess.Popen[bytes], int]:
    models = tmp_path / "models.yaml"
    models.write_text(f"models:\n  - name: demo\n    checkpoint: {demo_model_dir}\n", "utf-8")
    port = free_port()
    env = {
        **os.environ, "METRICS_PORT": "off", "LOG_LEVEL": "WARNING", "INFERENCE_DEVICE": "cpu",
        "MODELS_CONFIG": str(models), "INFERENCE_MODEL": "demo", "GRPC_PORT": str(port),
        "INFERENCE_KV_CACHE_BYTES": str(8 << 20), "SHUTDOWN_GRACE_S": str(grace_s),
    }  # fmt: skip
    return subprocess.Popen([sys.executable, "-m", "llm_inference"], env=env), port


def long_request(request_id: str, max_tokens: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        request_id=request_id,
        prompt_token_ids=[1, 17, 240, 1033],
        sampling=common_pb2.SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True),
    )


def test_sigterm_drains_then_exits(demo_model_dir: Path, tmp_path: Path) -> None:
    process, port = start(demo_model_dir, tmp_path, grace_s=30.0)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            health.Check(health_pb2.HealthCheckRequest(), timeout=START_TIMEOUT_S,
                         wait_for_ready=True)  # fmt: skip
            stub = pb_grpc.InferenceServiceStub(channel)
            watch = stub.WatchLoad(pb.WatchLoadRequest(interval_ms=60_000), timeout=60)
            assert next(watch).load.draining is False
            stream = stub.Generate(long_request("long", 200), timeout=60)
            first = next(stream)
            assert first.token_ids
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            # Reported at once, though the next report was a minute away.
            assert next(watch).load.draining is True
            assert time.monotonic() - signalled < 2.0
            status = health.Check(health_pb2.HealthCheckRequest(), timeout=5).status
            assert status == health_pb2.HealthCheckResponse.NOT_SERVING
            with pytest.raises(grpc.RpcError) as refused:
                list(stub.Generate(long_request("late", 4), timeout=10))
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            rest = list(stream)
            assert rest[-1].finish_reason == common_pb2.FINISH_REASON_LENGTH
            assert len(first.token_ids) + sum(len(m.token_ids) for m in rest) == 200
            last_reports = list(watch)  # the load stream ends cleanly once drained
            assert [r.load.draining for r in last_reports] == [True]
        assert process.wait(timeout=15) == 0
        assert time.monotonic() - signalled < 30.0  # done well before the grace period
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_stream_longer_than_the_grace_is_handed_back_with_error(
    demo_model_dir: Path, tmp_path: Path
) -> None:
    process, port = start(demo_model_dir, tmp_path, grace_s=2.0)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=START_TIMEOUT_S, wait_for_ready=True
            )
            stub = pb_grpc.InferenceServiceStub(channel)
            stream = stub.Generate(long_request("endless", 100_000 // 64), timeout=60)
            assert next(stream).token_ids
            signalled = time.monotonic()
            process.send_signal(signal.SIGTERM)
            rest = list(stream)
            assert rest[-1].finish_reason == common_pb2.FINISH_REASON_ERROR
            assert 0.5 < time.monotonic() - signalled < 2.5  # at the grace minus its margin
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
