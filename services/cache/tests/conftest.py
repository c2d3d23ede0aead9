"""Fixtures: the real encoder (loaded once), settings on a per-test Redis key prefix, an
in-process CacheService on port 0, and request builders."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio
from prometheus_client import CollectorRegistry

from llm_cache.config import (
    EncryptionSettings,
    FeedSettings,
    Limits,
    Policy,
    RedisSettings,
    SemanticSettings,
    Settings,
)
from llm_cache.encoder import Encoder
from llm_cache.metrics import CacheMetrics
from llm_cache.server import CacheApp, build_spec, load_encoder
from llm_common.resilience import BreakerMetrics
from llm_testing import RunningServer, running_server, settings_for_tests
from llmapi.cache.v1 import cache_service_pb2 as pb
from llmapi.cache.v1 import cache_service_pb2_grpc as pb_grpc
from llmapi.common.v1 import common_pb2

MODEL = "demo-llama"


@pytest.fixture(scope="session")
def encoder() -> Encoder:
    return load_encoder(SemanticSettings())


@pytest.fixture
def make_settings(
    redis_url: str, redis_prefix: str, redis_client: redis.asyncio.Redis
) -> Callable[..., Settings]:
    """Settings on this test's key prefix (cleaned up by `redis_client`); keyword overrides
    replace fields of Policy, SemanticSettings, RedisSettings, Limits or FeedSettings by
    name."""

    def make(**overrides: Any) -> Settings:
        groups: dict[str, Any] = {
            "redis": RedisSettings(url=redis_url, key_prefix=redis_prefix),
            "policy": Policy(),
            "semantic": SemanticSettings(encoder_threads=1),
            "limits": Limits(),
            "feed": FeedSettings(),
        }
        for group, value in groups.items():
            names = {k: v for k, v in overrides.items() if hasattr(value, k)}
            groups[group] = replace(value, **names)
        return Settings(server=settings_for_tests("cache"), **groups)

    return make


@dataclass(frozen=True, slots=True)
class Served:
    app: CacheApp
    stub: pb_grpc.CacheServiceAsyncStub
    server: RunningServer


ServeCache = Callable[..., contextlib.AbstractAsyncContextManager[Served]]


@pytest.fixture
def serve_cache(encoder: Encoder) -> ServeCache:
    """Runs CacheService for `settings` (fresh metric registries), by default once its index
    is built."""

    @contextlib.asynccontextmanager
    async def serve(settings: Settings, *, wait_ready: bool = True) -> AsyncIterator[Served]:
        app = CacheApp(
            settings,
            encoder,
            metrics=CacheMetrics(CollectorRegistry()),
            breaker_metrics=BreakerMetrics(CollectorRegistry()),
        )
        async with running_server(build_spec(app), settings=settings.server) as server:
            if wait_ready and app.sync is not None:
                await asyncio.wait_for(app.sync.ready.wait(), timeout=10)
            yield Served(app, pb_grpc.CacheServiceStub(server.channel), server)

    return serve


@pytest.fixture
async def served(
    make_settings: Callable[..., Settings], serve_cache: ServeCache
) -> AsyncIterator[Served]:
    """CacheService with default settings."""
    async with serve_cache(make_settings()) as running:
        yield running


def chat(*turns: tuple[common_pb2.Role.ValueType, str]) -> list[common_pb2.ChatMessage]:
    return [common_pb2.ChatMessage(role=role, content=text) for role, text in turns]


class Requests:
    """Builders for CacheService requests (deterministic greedy sampling by default)."""

    def key(
        self,
        text: str = "What is the capital of France?",
        *,
        tenant: str = "tenant-a",
        model: str = MODEL,
        history: Sequence[tuple[common_pb2.Role.ValueType, str]] = (),
        prompt: str | None = None,
        ids: Sequence[int] = (),
        **sampling: Any,
    ) -> pb.CacheKey:
        sampling.setdefault("temperature", 0.0)
        key = pb.CacheKey(
            tenant_id=tenant, model=model, sampling=common_pb2.SamplingParams(**sampling)
        )
        if prompt is not None:
            key.prompt = prompt
        elif not ids:
            key.messages.extend(chat(*history, (common_pb2.ROLE_USER, text)))
        key.prompt_token_ids.extend(ids)
        return key

    def response(self, text: str = "Paris.", completion_tokens: int = 2) -> pb.CachedResponse:
        return pb.CachedResponse(
            text=text,
            token_ids=list(range(10, 10 + completion_tokens)),
            finish_reason=common_pb2.FINISH_REASON_STOP,
            usage=common_pb2.Usage(
                prompt_tokens=12,
                completion_tokens=completion_tokens,
                total_tokens=12 + completion_tokens,
            ),
        )

    def store(self, key: pb.CacheKey, text: str = "Paris.", **kw: Any) -> pb.StoreRequest:
        return pb.StoreRequest(key=key, response=self.response(text), **kw)

    def lookup(
        self, key: pb.CacheKey, *, semantic: bool = True, threshold: float | None = None, **kw: Any
    ) -> pb.LookupRequest:
        options = pb.LookupOptions(semantic=semantic, **kw)
        if threshold is not None:
            options.similarity_threshold = threshold
        return pb.LookupRequest(key=key, options=options)


@pytest.fixture
def req() -> Requests:
    return Requests()


def key_file(tmp_path: Path, *lines: str) -> Path:
    """A master key file (0600) holding `lines` (from envelope.new_key_line)."""
    path = tmp_path / "cache-master.keys"
    path.write_text("".join(f"{line}\n" for line in lines))
    path.chmod(0o600)
    return path


def with_key(settings: Settings, path: Path, **held: float) -> Settings:
    """`settings` encrypting with the master key file at `path` (held: DEK cache options)."""
    encryption = EncryptionSettings(master_key_file=path, **held)  # type: ignore[arg-type]
    return replace(settings, encryption=encryption)
