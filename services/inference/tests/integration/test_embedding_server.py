"""InferenceService for an embedding deployment (the bundled all-MiniLM-L6-v2) on port 0."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from llm_common.errors import parse_error
from llm_inference.config import EngineSettings, Limits, Settings
from llm_inference.embedding.encoder import SentenceEncoder
from llm_inference.metrics import InferenceMetrics
from llm_inference.server import load_service
from llm_testing import RunningServer, running_server, settings_for_tests
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as pb
from llmapi.inference.v1 import inference_service_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

TEXTS = ["A cat sits on the mat.", "Streaming tokens over gRPC.", "日本語の文"]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server(
    minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RunningServer]:
    models = tmp_path_factory.mktemp("catalog") / "models.yaml"
    models.write_text(
        "models:\n  - name: minilm\n    kind: embedding\n"
        f"    checkpoint: {minilm_dir}\n    context_length: 256\n    default_max_tokens: 1\n",
        encoding="utf-8",
    )
    settings = Settings(
        server=settings_for_tests("inference"),
        model="minilm",
        models_config=models,
        model_root=models.parent,
        replica_id="embed-1",
        engine=EngineSettings(device="cpu"),
        limits=Limits(max_embed_inputs=4, max_embed_text_bytes=1000),
    )
    loaded = await load_service(settings, InferenceMetrics("minilm", CollectorRegistry()))
    async with running_server(loaded.spec, settings=settings.server) as running:
        yield running


@pytest.fixture
def stub(server: RunningServer) -> pb_grpc.InferenceServiceAsyncStub:
    return pb_grpc.InferenceServiceStub(server.channel)


async def test_embed_returns_the_encoder_vectors_in_order(
    stub: pb_grpc.InferenceServiceAsyncStub, minilm_dir: Path
) -> None:
    reply = await stub.Embed(pb.EmbedRequest(request_id="e1", inputs=TEXTS), timeout=30)
    assert reply.dimensions == 384
    assert len(reply.embeddings) == len(TEXTS)
    served = np.array([list(e.values) for e in reply.embeddings])
    expected = SentenceEncoder.from_dir(minilm_dir).encode(TEXTS, normalize=False)
    np.testing.assert_allclose(served, np.array(expected.vectors), atol=1e-5, rtol=0)
    assert reply.prompt_tokens == expected.prompt_tokens


async def test_normalize_gives_unit_vectors(stub: pb_grpc.InferenceServiceAsyncStub) -> None:
    reply = await stub.Embed(pb.EmbedRequest(inputs=TEXTS[:2], normalize=True), timeout=30)
    for embedding in reply.embeddings:
        assert math.isclose(math.hypot(*embedding.values), 1.0, rel_tol=1e-5)


async def test_info_and_load_describe_an_embedding_deployment(
    stub: pb_grpc.InferenceServiceAsyncStub,
) -> None:
    info = await stub.Info(pb.InfoRequest(), timeout=5)
    assert (info.model, info.kind) == ("minilm", common_pb2.MODEL_KIND_EMBEDDING)
    assert (info.backend, info.dtype, info.device, info.max_context) == (
        "torch", "float32", "cpu", 256,
    )  # fmt: skip
    load = (await stub.GetLoad(pb.GetLoadRequest(), timeout=5)).load
    assert (load.replica_id, load.num_waiting, load.num_running) == ("embed-1", 0, 0)


@pytest.mark.parametrize(
    ("inputs", "field"),
    [([], "inputs"), (["a"] * 5, "inputs"), (["ok", ""], "inputs[1]"), (["x" * 1001], "inputs[0]")],
)
async def test_bad_embed_input(
    stub: pb_grpc.InferenceServiceAsyncStub, inputs: list[str], field: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await stub.Embed(pb.EmbedRequest(inputs=inputs), timeout=5)
    details = parse_error(err.value)
    assert details.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in details.field_violations] == [field]


async def test_generate_needs_a_generation_deployment(
    stub: pb_grpc.InferenceServiceAsyncStub,
) -> None:
    request = pb.GenerateRequest(request_id="g", prompt_token_ids=[1, 2])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stub.Generate(request, timeout=5):
            pass
    details = parse_error(err.value)
    assert details.code == grpc.StatusCode.FAILED_PRECONDITION
    assert details.precondition_violations[0].subject == "minilm"
