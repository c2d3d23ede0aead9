"""Wiring: load every model's tokenizer, then run TokenizerService on llm_common's server."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from llm_common import server as common_server
from llm_common.models_config import load_catalog
from llm_common.server import BuiltServer, ServiceSpec
from llm_common.tokenization.registry import Registry, load_registry
from llm_tokenizer.config import Limits, Settings
from llm_tokenizer.service import TokenizerServicer
from llmapi.tokenizer.v1 import tokenizer_service_pb2 as pb
from llmapi.tokenizer.v1 import tokenizer_service_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["TokenizerService"].full_name


def build_spec(registry: Registry, limits: Limits) -> ServiceSpec:
    """The ServiceSpec for llm_common.server: TokenizerService over a loaded registry."""
    servicer = TokenizerServicer(registry, limits)

    def register(server: grpc.aio.Server) -> None:
        pb_grpc.add_TokenizerServiceServicer_to_server(servicer, server)

    return ServiceSpec(service_names=(SERVICE_NAME,), register=register)


def load(settings: Settings) -> Registry:
    """Every model of MODELS_CONFIG; ConfigError (naming model and path) if any cannot load."""
    return load_registry(load_catalog(settings.models_config, settings.model_root))


async def serve(
    settings: Settings,
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[BuiltServer], None] | None = None,
) -> None:
    """Load the models, then serve until SIGTERM/SIGINT (or `stop`).

    Models load before the port opens: a broken checkpoint fails start-up instead of
    leaving a listening but useless server.
    """
    registry = await asyncio.to_thread(load, settings)
    spec = build_spec(registry, settings.limits)
    await common_server.serve(settings.server, spec, stop=stop, ready=ready)
