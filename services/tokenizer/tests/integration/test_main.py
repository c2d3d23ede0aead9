"""`python -m llm_tokenizer` as a process: start-up failures exit 2; SIGTERM drains and exits 0."""

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
from llmapi.tokenizer.v1 import tokenizer_service_pb2 as pb
from llmapi.tokenizer.v1 import tokenizer_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

START_TIMEOUT_S = 30


def run_env(**overrides: str) -> dict[str, str]:
    env = {**os.environ, "METRICS_PORT": "off", "LOG_LEVEL": "WARNING"}
    env.update(overrides)
    return env


def test_missing_model_fails_start_up_with_one_line(tmp_path: Path) -> None:
    models = tmp_path / "models.yaml"
    models.write_text("models:\n  - name: ghost\n    checkpoint: ghost\n", encoding="utf-8")
    env = run_env(MODELS_CONFIG=str(models), MODEL_ROOT=str(tmp_path), GRPC_PORT="0")
    result = subprocess.run(
        [sys.executable, "-m", "llm_tokenizer"],
        env=env,
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines == [
        "llm-tokenizer: configuration error: model ghost: tokenizer file not found: "
        f"{tmp_path / 'ghost' / 'tokenizer.json'}"
    ]


def test_bad_variable_fails_start_up() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "llm_tokenizer"],
        env=run_env(TOKENIZER_MAX_BATCH="many"),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 2
    assert "TOKENIZER_MAX_BATCH" in result.stderr


def test_serves_then_drains_on_sigterm(demo_model_dir: Path, tmp_path: Path) -> None:
    models = tmp_path / "models.yaml"
    models.write_text(
        f"models:\n  - name: demo-llama\n    checkpoint: {demo_model_dir}\n", encoding="utf-8"
    )
    port = free_port()
    env = run_env(MODELS_CONFIG=str(models), GRPC_PORT=str(port))
    process = subprocess.Popen([sys.executable, "-m", "llm_tokenizer"], env=env)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            reply = health.Check(
                health_pb2.HealthCheckRequest(), timeout=START_TIMEOUT_S, wait_for_ready=True
            )
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            stub = pb_grpc.TokenizerServiceStub(channel)
            encoded = stub.Encode(pb.EncodeRequest(model="demo-llama", texts=["hi"]), timeout=5)
            assert len(encoded.encodings) == 1
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=START_TIMEOUT_S) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
