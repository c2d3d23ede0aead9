"""`python -m llm_inference` as a process: serve + SIGTERM, start-up failures, CLI errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llm_testing import free_port
from llmapi.inference.v1 import inference_service_pb2 as pb
from llmapi.inference.v1 import inference_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 60


def run_env(**overrides: str) -> dict[str, str]:
    env = {**os.environ, "METRICS_PORT": "off", "LOG_LEVEL": "WARNING", "INFERENCE_DEVICE": "cpu"}
    env.update(overrides)
    return env


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "llm_inference", *args],
        env=env, capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False,
    )  # fmt: skip


def test_unknown_model_fails_start_up_with_one_line(tmp_path: Path) -> None:
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  - name: ghost\n    checkpoint: ghost\n", encoding="utf-8")
    env = run_env(MODELS_CONFIG=str(models), MODEL_ROOT=str(tmp_path), INFERENCE_MODEL="phantom")
    result = run(["serve"], env)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "llm-inference: configuration error: INFERENCE_MODEL: unknown model 'phantom' "
        "(known: ghost)"
    ]


def test_bad_variable_fails_start_up() -> None:
    result = run([], run_env(INFERENCE_BACKEND="vllm"))
    assert result.returncode == 2
    assert "INFERENCE_BACKEND: must be one of torch, tensorrt_llm" in result.stderr


def test_tensorrt_llm_backend_without_the_package_fails_clearly(
    demo_model_dir: Path, tmp_path: Path
) -> None:
    models = tmp_path / "models.yaml"
    models.write_text(f"models:\n  - name: demo\n    checkpoint: {demo_model_dir}\n", "utf-8")
    env = run_env(MODELS_CONFIG=str(models), INFERENCE_MODEL="demo",
                  INFERENCE_BACKEND="tensorrt_llm")  # fmt: skip
    result = run(["serve"], env)
    assert result.returncode == 2
    assert "INFERENCE_BACKEND: tensorrt_llm needs the `tensorrt_llm` package" in result.stderr


def test_generate_rejects_bad_arguments(demo_model_dir: Path) -> None:
    result = run(
        ["generate", "--model", str(demo_model_dir), "--prompt-token-ids", "1,x"], run_env()
    )
    assert result.returncode == 2
    assert "expected comma-separated integers" in result.stderr


def test_serves_then_drains_on_sigterm(demo_model_dir: Path, tmp_path: Path) -> None:
    models = tmp_path / "models.yaml"
    models.write_text(f"models:\n  - name: demo\n    checkpoint: {demo_model_dir}\n", "utf-8")
    port = free_port()
    env = run_env(
        MODELS_CONFIG=str(models), INFERENCE_MODEL="demo", GRPC_PORT=str(port),
        INFERENCE_KV_CACHE_BYTES=str(4 << 20),
    )  # fmt: skip
    # Plain `python -m llm_inference` serves too.
    process = subprocess.Popen([sys.executable, "-m", "llm_inference"], env=env)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = health.Check(
                health_pb2.HealthCheckRequest(), timeout=START_TIMEOUT_S, wait_for_ready=True
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            stub = pb_grpc.InferenceServiceStub(channel)
            info = stub.Info(pb.InfoRequest(), timeout=5)
            assert (info.model, info.backend) == ("demo", "torch")
            assert info.replica_id.endswith(f":{port}")
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
