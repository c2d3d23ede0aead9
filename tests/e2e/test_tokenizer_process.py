"""The tokenizer as it runs in the stack: a process on the repo's models.yaml, seen from outside."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from llm_testing import free_port
from llmapi.tokenizer.v1 import tokenizer_service_pb2 as pb
from llmapi.tokenizer.v1 import tokenizer_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.e2e

START_TIMEOUT_S = 60
SECRET_TEXT = "the launch code is 7-alpha-tango"


@dataclass
class Tokenizer:
    process: subprocess.Popen[str]
    channel: grpc.Channel
    metrics_port: int


@pytest.fixture
def faults() -> dict[str, str]:
    """Extra environment for the process; empty = no fault injection."""
    return {}


@pytest.fixture
def tokenizer(
    models_config: Path, demo_model_dir: Path, faults: dict[str, str]
) -> Iterator[Tokenizer]:
    grpc_port, metrics_port = free_port(), free_port()
    env = {
        **os.environ,
        **faults,
        "GRPC_PORT": str(grpc_port),
        "METRICS_PORT": str(metrics_port),
        "MODELS_CONFIG": str(models_config),
        "MODEL_ROOT": str(demo_model_dir.parent),
        "LOG_LEVEL": "INFO",
    }
    process = subprocess.Popen(
        [sys.executable, "-m", "llm_tokenizer"], env=env, stderr=subprocess.PIPE, text=True
    )
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    try:
        health = health_pb2_grpc.HealthStub(channel)
        reply = health.Check(
            health_pb2.HealthCheckRequest(), timeout=START_TIMEOUT_S, wait_for_ready=True
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
        yield Tokenizer(process, channel, metrics_port)
    finally:
        channel.close()
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=START_TIMEOUT_S)


def test_serves_the_catalogue_model_and_its_alias(tokenizer: Tokenizer) -> None:
    stub = pb_grpc.TokenizerServiceStub(tokenizer.channel)
    text = "Hello, 世界 👋"
    by_name = stub.Encode(pb.EncodeRequest(model="demo-llama", texts=[text]), timeout=5)
    by_alias = stub.Encode(pb.EncodeRequest(model="demo", texts=[text]), timeout=5)
    assert list(by_name.encodings[0].ids) == list(by_alias.encodings[0].ids)
    decoded = stub.Decode(
        pb.DecodeRequest(model="demo-llama", sequences=[by_name.encodings[0]]), timeout=5
    )
    assert decoded.texts == [text]


def test_reflection_lists_the_services(tokenizer: Tokenizer) -> None:
    stub = reflection_pb2_grpc.ServerReflectionStub(tokenizer.channel)
    replies = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
    )
    names = {s.name for reply in replies for s in reply.list_services_response.service}
    assert "llmapi.tokenizer.v1.TokenizerService" in names
    assert "grpc.health.v1.Health" in names


def test_metrics_count_rpcs_by_code(tokenizer: Tokenizer) -> None:
    stub = pb_grpc.TokenizerServiceStub(tokenizer.channel)
    stub.Encode(pb.EncodeRequest(model="demo-llama", texts=["x"]), timeout=5)
    with pytest.raises(grpc.RpcError) as err:
        stub.Encode(pb.EncodeRequest(model="no-such-model", texts=["x"]), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    url = f"http://127.0.0.1:{tokenizer.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        body = response.read().decode()
    samples = [line for line in body.splitlines() if line.startswith("llm_rpc_requests_total{")]
    assert any('method="Encode"' in s and 'code="OK"' in s for s in samples)
    assert any('method="Encode"' in s and 'code="NOT_FOUND"' in s for s in samples)


def test_logs_are_json_with_request_ids_and_no_prompt_text(tokenizer: Tokenizer) -> None:
    stub = pb_grpc.TokenizerServiceStub(tokenizer.channel)
    stub.Encode(
        pb.EncodeRequest(model="demo-llama", texts=[SECRET_TEXT]),
        timeout=5,
        metadata=(("x-request-id", "e2e-req-1"),),
    )
    tokenizer.process.send_signal(signal.SIGTERM)
    _, stderr = tokenizer.process.communicate(timeout=START_TIMEOUT_S)
    assert tokenizer.process.returncode == 0
    records = [json.loads(line) for line in stderr.splitlines() if line.startswith("{")]
    assert records, "the service logged nothing"
    assert any(r.get("request_id") == "e2e-req-1" for r in records)
    assert SECRET_TEXT not in stderr


@pytest.mark.parametrize(
    "faults", [{"LLM_FAULTS": "/llmapi.tokenizer.v1.*/Encode:error_rate=1,code=UNAVAILABLE"}]
)
def test_fault_injection_is_wired_into_the_server(tokenizer: Tokenizer) -> None:
    stub = pb_grpc.TokenizerServiceStub(tokenizer.channel)
    with pytest.raises(grpc.RpcError) as err:
        stub.Encode(pb.EncodeRequest(model="demo-llama", texts=["x"]), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    count = stub.CountTokens(pb.CountTokensRequest(model="demo-llama", texts=["x"]), timeout=5)
    assert count.total >= 1  # other methods are untouched; health stayed SERVING (fixture)
