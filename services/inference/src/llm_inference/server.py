"""Wiring: resolve the model, load it (engine or encoder), run InferenceService on llm_common."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import torch
from tokenizers import Tokenizer

from llm_common import server as common_server
from llm_common.server import BuiltServer, ServiceSpec
from llm_inference.backends.factory import build_backend, resolve_device, resolve_dtype
from llm_inference.config import Settings
from llm_inference.deployment import (
    EMBEDDING,
    ModelDeployment,
    checkpoint_context,
    model_facts,
    resolve_deployment,
)
from llm_inference.embedding.encoder import SentenceEncoder
from llm_inference.embedding.runtime import EmbeddingRuntime
from llm_inference.engine.engine import AsyncEngine
from llm_inference.grammar_metrics import GrammarCollector
from llm_inference.metrics import InferenceMetrics
from llm_inference.service import Generation, InferenceServicer
from llm_inference.speculative_metrics import SpeculativeCollector
from llm_inference.token_bytes import TokenBytes, token_bytes_table
from llm_inference.weights_digest import weights_digest
from llmapi.inference.v1 import inference_service_pb2 as pb
from llmapi.inference.v1 import inference_service_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["InferenceService"].full_name
_TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True, slots=True)
class LoadedService:
    """A loaded model and the ServiceSpec that serves it (started by llm_common.server)."""

    deployment: ModelDeployment
    servicer: InferenceServicer
    spec: ServiceSpec


async def load_service(
    settings: Settings, metrics: InferenceMetrics | None = None
) -> LoadedService:
    """Resolve INFERENCE_MODEL and load it; ConfigError when it cannot be served.

    Weights load before the port opens: a broken checkpoint fails start-up instead of
    leaving a listening but useless server.
    """
    deployment = await asyncio.to_thread(resolve_deployment, settings)
    metrics = metrics if metrics is not None else InferenceMetrics(deployment.name)
    if deployment.kind == EMBEDDING:
        return await _load_embedding(settings, deployment, metrics)
    return await _load_generation(settings, deployment, metrics)


async def _load_generation(
    settings: Settings, deployment: ModelDeployment, metrics: InferenceMetrics
) -> LoadedService:
    max_context = checkpoint_context(deployment.checkpoint, deployment.context_length)
    backend = await asyncio.to_thread(
        build_backend, settings.engine, deployment.checkpoint, deployment.name, max_context
    )
    facts = model_facts(deployment, backend.info().max_context)
    generation = Generation(backend, facts, _token_bytes(deployment.checkpoint))
    digest = await asyncio.to_thread(weights_digest, deployment.checkpoint)
    servicer = _servicer(settings, deployment, generation, metrics, digest)

    async def on_start() -> None:
        await backend.start()
        metrics.watch_load(servicer.load)
        if isinstance(backend, AsyncEngine):  # the torch engine's own constrained decoding
            core = backend.core
            metrics.watch(
                GrammarCollector(
                    deployment.name, lambda: core.grammar_stats, lambda: core.grammars.stats
                )
            )
            metrics.watch(SpeculativeCollector(deployment.name, lambda: core.speculative_stats))

    async def on_stop() -> None:
        metrics.unwatch_load()
        await backend.stop()

    return LoadedService(deployment, servicer, build_spec(servicer, on_start, on_stop))


async def _load_embedding(
    settings: Settings, deployment: ModelDeployment, metrics: InferenceMetrics
) -> LoadedService:
    device = resolve_device(settings.engine.device)
    encoder = await asyncio.to_thread(
        SentenceEncoder.from_dir,
        deployment.checkpoint,
        device=device,
        dtype=_TORCH_DTYPES[resolve_dtype(settings.engine.dtype, device)],
        batch_size=settings.limits.embed_batch_size,
    )
    servicer = _servicer(settings, deployment, EmbeddingRuntime(encoder, deployment.name), metrics)

    async def on_start() -> None:
        metrics.watch_load(servicer.load)

    async def on_stop() -> None:
        metrics.unwatch_load()

    return LoadedService(deployment, servicer, build_spec(servicer, on_start, on_stop))


def _servicer(
    settings: Settings,
    deployment: ModelDeployment,
    runtime: Generation | EmbeddingRuntime,
    metrics: InferenceMetrics,
    digest: str = "",
) -> InferenceServicer:
    return InferenceServicer(
        deployment.name,
        runtime,
        limits=settings.limits,
        metrics=metrics,
        replica_id=settings.replica_id,
        weights_digest=digest,
    )


def build_spec(
    servicer: InferenceServicer,
    on_start: common_server.Hook | None = None,
    on_stop: common_server.Hook | None = None,
) -> ServiceSpec:
    """The ServiceSpec for llm_common.server: InferenceService plus start/stop hooks."""

    def register(server: grpc.aio.Server) -> None:
        pb_grpc.add_InferenceServiceServicer_to_server(servicer, server)

    return ServiceSpec(
        service_names=(SERVICE_NAME,),
        register=register,
        on_start=on_start,
        on_stop=on_stop,
        on_drain=servicer.drain,
    )


def _token_bytes(checkpoint: Path) -> TokenBytes | None:
    path = checkpoint / "tokenizer.json"
    if not path.is_file():
        return None
    return token_bytes_table(Tokenizer.from_file(str(path)))


async def serve(
    settings: Settings,
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[BuiltServer], None] | None = None,
) -> None:
    """Load the model, then serve until SIGTERM/SIGINT (or `stop`)."""
    loaded = await load_service(settings)
    await common_server.serve(settings.server, loaded.spec, stop=stop, ready=ready)
