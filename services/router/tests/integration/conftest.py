"""The real downstream services, in process on port 0: tokenizer, inference replicas (real
PyTorch engine on the demo checkpoint), billing and auth on the real Redis; and routers over
them. Test-only imports of the other services' packages; the router never imports them."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import pytest_asyncio
from google.protobuf import timestamp_pb2
from prometheus_client import CollectorRegistry

from llm_auth.principal import KeyLimits
from llm_auth.testing import AuthHarness, delete_prefix, make_settings, serving, unique_prefix
from llm_billing.config import LedgerSettings, RedisSettings
from llm_billing.config import Settings as BillingSettings
from llm_billing.metrics import BillingMetrics
from llm_billing.prices import load_prices
from llm_billing.server import build_billing
from llm_billing.server import build_spec as billing_spec
from llm_cache.config import RedisSettings as CacheRedisSettings
from llm_cache.config import SemanticSettings
from llm_cache.config import Settings as CacheSettings
from llm_cache.metrics import CacheMetrics
from llm_cache.server import CacheApp
from llm_cache.server import build_spec as cache_spec
from llm_common.config import ServerSettings
from llm_common.models_config import Deployment, ModelCatalog, load_catalog
from llm_common.tokenization.registry import load_registry
from llm_inference.config import EngineSettings
from llm_inference.config import Limits as InferenceLimits
from llm_inference.config import Settings as InferenceSettings
from llm_inference.metrics import InferenceMetrics
from llm_inference.server import load_service
from llm_router.clients.settings import DownstreamSettings
from llm_router.config import Settings
from llm_router.observability import RouterMetrics
from llm_router.routing.settings import RoutingSettings
from llm_router.safety.policies import PolicyBook
from llm_router.server import Runtime, build_runtime
from llm_testing import RunningServer, running_server, settings_for_tests
from llm_tokenizer.config import Limits as TokenizerLimits
from llm_tokenizer.server import build_spec as tokenizer_spec
from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.billing.v1 import billing_service_pb2_grpc as billing_grpc
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as inf_pb
from llmapi.inference.v1 import inference_service_pb2_grpc as inf_grpc
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc

MIB = 1 << 20
MODEL = "demo-llama"
REPO_ROOT = Path(__file__).resolve().parents[4]
PRICES = REPO_ROOT / "infra" / "config" / "prices.yaml"
EMBED_MODEL = "minilm"
# The repository's prices plus one for the test's embedding model.
EMBED_PRICE = f"""
  - model: {EMBED_MODEL}
    effective_from: "2025-01-01T00:00:00Z"
    input_micros_per_mtok: 20000
    cached_input_micros_per_mtok: 20000
    output_micros_per_mtok: 0
"""
# 4 MiB of KV: 64 blocks of 16 tokens; small batches keep two replicas light on 2 cores.
ENGINE = EngineSettings(
    device="cpu", dtype="float32", kv_cache_bytes=4 * MIB, max_num_seqs=8, max_batched_tokens=256
)
SCOPES = "completion:write,embedding:read"


def write_catalog(path: Path, checkpoint: Path) -> Path:
    """The models.yaml the tokenizer and the inference replicas load."""
    path.write_text(
        "tiers: [small, medium, large]\n"
        "models:\n"
        f"  - name: {MODEL}\n"
        "    aliases: [demo]\n"
        f"    checkpoint: {checkpoint}\n"
        "    context_length: 2048\n"
        "    default_max_tokens: 32\n"
        "    tier: small\n",
        encoding="utf-8",
    )
    return path


def with_deployments(catalog: ModelCatalog, *deployments: Deployment) -> ModelCatalog:
    """`catalog` with the demo model served by `deployments` (the router's view)."""
    spec = dataclasses.replace(catalog.models[MODEL], deployments=tuple(deployments))
    return dataclasses.replace(catalog, models={**catalog.models, MODEL: spec})


@dataclass
class Stack:
    """Running downstream services and how to reach them."""

    catalog: ModelCatalog
    tokenizer: RunningServer
    replicas: list[RunningServer]
    billing: RunningServer
    auth: AuthHarness
    cache: RunningServer
    workdir: Path
    replica_metrics: list[CollectorRegistry]

    @property
    def replica_addrs(self) -> list[str]:
        return [r.target for r in self.replicas]

    def inference_stub(self, index: int) -> inf_grpc.InferenceServiceAsyncStub:
        return inf_grpc.InferenceServiceStub(self.replicas[index].channel)

    async def idle(self) -> bool:
        """Nothing waiting or running on any replica, every KV block free."""
        for index in range(len(self.replicas)):
            load = (await self.inference_stub(index).GetLoad(inf_pb.GetLoadRequest())).load
            if load.num_running or load.num_waiting or load.kv_cache_usage:
                return False
        return True

    async def generating_beyond(self, tokens: int, max_tokens: int) -> bool:
        """One request running (of `max_tokens`), with more than `tokens` generated."""
        running = remaining = 0
        for index in range(len(self.replicas)):
            load = (await self.inference_stub(index).GetLoad(inf_pb.GetLoadRequest())).load
            running += load.num_running
            remaining += load.running_remaining_tokens
        return running == 1 and remaining < max_tokens - tokens

    def generated_tokens(self) -> float:
        """Tokens the replicas generated so far (cancelled requests included)."""
        samples = (
            r.get_sample_value("llm_inference_generation_tokens_total", {"model_name": MODEL})
            for r in self.replica_metrics
        )
        return sum(s or 0.0 for s in samples)

    async def tenant(self, *, tokens_per_minute: int = 0) -> Caller:
        """A fresh tenant with an API key in auth (so its quota is real)."""
        tenant = f"t{uuid.uuid4().hex[:12]}"
        record, _ = await self.auth.create_key(
            tenant,
            scopes=("completion:write", "embedding:read"),
            limits=KeyLimits(tokens_per_minute=tokens_per_minute),
        )
        return Caller(tenant, record.key_id)


HOLDING = RoutingSettings(
    load_interval_ms=50, load_stale_s=2.0, tokens_per_message=4096, max_hold_ms=0
)  # after the first token a replica holds everything: only Stop can tell what it generated


async def cancel_while_generating(
    router: Router, stack: Stack, tenant: str, metadata: Sequence[tuple[str, str]]
) -> tuple[int, float]:
    """Stream a 900-token chat, cancel it once the replicas generated 20 tokens or more; the
    completion tokens billing charged and the tokens the replicas generated meanwhile."""
    await wait_for(stack.idle)
    generated_before = stack.generated_tokens()
    request = pb.ChatStreamRequest(
        model="demo",
        messages=[common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content="Count slowly.")],
        sampling=common_pb2.SamplingParams(max_tokens=900, ignore_eos=True, temperature=0.0),
        cache=pb.CachePolicy(bypass=True),
    )
    call = router.stub.ChatStream(request, metadata=metadata)
    await wait_for(lambda: stack.generating_beyond(20, 900))
    call.cancel()
    await wait_for(stack.idle)
    total = await billed(stack, tenant, 1)
    return total.completion_tokens, stack.generated_tokens() - generated_before


@dataclass(frozen=True)
class Caller:
    """A tenant and key, as the edge would announce them."""

    tenant: str
    key: str
    scopes: str = SCOPES

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("x-tenant-id", self.tenant), ("x-key-id", self.key), ("x-scopes", self.scopes))


@dataclass
class Router:
    """A running router and a stub to call it."""

    runtime: Runtime
    server: RunningServer
    stub: pb_grpc.LLMServiceAsyncStub
    registry: CollectorRegistry
    settings: Settings = field(repr=False)

    def metric(self, name: str, **labels: str) -> float:
        value = self.registry.get_sample_value(name, labels)
        return 0.0 if value is None else value


@contextlib.asynccontextmanager
async def running_inference(
    catalog_path: Path, replica_id: str, registry: CollectorRegistry | None = None
) -> AsyncIterator[RunningServer]:
    """One inference replica with the real engine (its metrics in `registry`)."""
    settings = InferenceSettings(
        server=settings_for_tests("inference"),
        model="demo",
        models_config=catalog_path,
        model_root=catalog_path.parent,
        replica_id=replica_id,
        engine=ENGINE,
        limits=InferenceLimits(),
    )
    metrics = InferenceMetrics(MODEL, registry or CollectorRegistry())
    loaded = await load_service(settings, metrics)
    async with running_server(loaded.spec, settings=settings.server) as server:
        yield server


def prices_with_embedding(workdir: Path) -> Path:
    path = workdir / "prices.yaml"
    if not path.exists():
        path.write_text(PRICES.read_text(encoding="utf-8") + EMBED_PRICE, encoding="utf-8")
    return path


@contextlib.asynccontextmanager
async def running_billing(
    redis_url: str, prefix: str, workdir: Path, port: int = 0, *, older: bool = False
) -> AsyncIterator[RunningServer]:
    """The billing service on the real Redis, state under `prefix`. `older`: one from before
    ReserveBatch, which answers it UNIMPLEMENTED."""
    prices = prices_with_embedding(workdir)
    settings = BillingSettings(
        server=ServerSettings(service_name="billing", grpc_port=port, metrics_port=None),
        redis=RedisSettings(redis_url),
        prices_config=prices,
        ledger=LedgerSettings(key_prefix=f"{prefix}billing:"),
    )
    billing = build_billing(
        settings, load_prices(prices, "USD"), metrics=BillingMetrics(CollectorRegistry())
    )
    if older:
        billing.servicer.ReserveBatch = _unimplemented  # type: ignore[method-assign]
    async with running_server(billing_spec(billing), settings=settings.server) as server:
        yield server


def reserve_request(rid: str, tenant: str, model: str = "demo-llama") -> billing_pb.ReserveRequest:
    """A billing Reserve of 100 prompt tokens + 50 completion tokens, as the router sends it."""
    return billing_pb.ReserveRequest(
        request_id=rid,
        tenant_id=tenant,
        key_id="k1",
        model=model,
        prompt_tokens=100,
        max_completion_tokens=50,
    )


async def _unimplemented(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
    await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")


@contextlib.asynccontextmanager
async def running_cache(redis_url: str, prefix: str) -> AsyncIterator[RunningServer]:
    """The response cache on the real Redis; exact matching only (no encoder to load)."""
    settings = CacheSettings(
        server=settings_for_tests("cache"),
        redis=CacheRedisSettings(url=redis_url, key_prefix=prefix),
        semantic=SemanticSettings(enabled=False),
    )
    app = CacheApp(settings, None, metrics=CacheMetrics(CollectorRegistry()))
    async with running_server(cache_spec(app), settings=settings.server) as server:
        yield server


@contextlib.asynccontextmanager
async def running_stack(
    demo_model_dir: Path, redis_url: str, workdir: Path, *, replicas: int = 2
) -> AsyncIterator[Stack]:
    """Tokenizer, `replicas` inference replicas, billing and auth; Redis state cleaned up."""
    catalog_path = write_catalog(workdir / "models.yaml", demo_model_dir)
    catalog = load_catalog(catalog_path, workdir)
    prefix = unique_prefix()
    async with contextlib.AsyncExitStack() as stack:
        registry = load_registry(catalog)
        tokenizer = await stack.enter_async_context(
            running_server(
                tokenizer_spec(registry, TokenizerLimits()), settings=settings_for_tests("tok")
            )
        )
        registries = [CollectorRegistry() for _ in range(replicas)]
        servers = [
            await stack.enter_async_context(
                running_inference(catalog_path, f"replica-{i}", registries[i])
            )
            for i in range(replicas)
        ]
        billing = await stack.enter_async_context(running_billing(redis_url, prefix, workdir))
        auth = await stack.enter_async_context(serving(make_settings(redis_url, f"{prefix}auth:")))
        cache = await stack.enter_async_context(running_cache(redis_url, f"{prefix}cache:"))
        try:
            yield Stack(catalog, tokenizer, servers, billing, auth, cache, workdir, registries)
        finally:
            await delete_prefix(redis_url, prefix)


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def stack(
    demo_model_dir: Path, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Stack]:
    """One stack for every router integration test (tests use their own tenants)."""
    async with running_stack(demo_model_dir, redis_url, tmp_path_factory.mktemp("stack")) as s:
        yield s


def router_settings(
    stack: Stack,
    workdir: Path,
    *,
    billing_addr: str | None = None,
    routing: RoutingSettings | None = None,
    cache: bool = True,
    **downstream: Any,
) -> Settings:
    return Settings(
        server=settings_for_tests("router"),
        downstream=DownstreamSettings(
            tokenizer_addr=stack.tokenizer.target,
            billing_addr=billing_addr or stack.billing.target,
            auth_addr=f"127.0.0.1:{stack.auth.port}",
            cache_addr=stack.cache.target if cache else None,
            **downstream,
        ),
        outbox_dir=workdir / f"outbox-{uuid.uuid4().hex[:8]}",
        routing=routing or RoutingSettings(load_interval_ms=50, load_stale_s=2.0),
    )


@contextlib.asynccontextmanager
async def running_router(
    settings: Settings, catalog: ModelCatalog, policies: PolicyBook | None = None
) -> AsyncIterator[Router]:
    """A router over `catalog` on port 0, with its own metrics registry."""
    registry = CollectorRegistry()
    runtime = await build_runtime(
        settings,
        catalog=catalog,
        policies=policies or PolicyBook(),
        metrics=RouterMetrics(registry),
    )
    async with running_server(runtime.spec(), settings=settings.server) as server:
        yield Router(runtime, server, pb_grpc.LLMServiceStub(server.channel), registry, settings)


def deployment(name: str, replicas: Sequence[str], weight: int = 100) -> Deployment:
    return Deployment(name=name, replicas=tuple(replicas), weight=weight)


async def wait_for(predicate: Any, timeout_s: float = 10.0, interval_s: float = 0.05) -> Any:
    """Poll an async predicate until it returns something truthy."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(interval_s)


async def billed(stack: Stack, tenant: str, requests: int) -> billing_pb.UsageBucket:
    """`tenant`'s usage at billing, once it counts `requests` requests."""

    async def total() -> billing_pb.UsageBucket | None:
        now = int(time.time())
        response = await billing_grpc.BillingServiceStub(stack.billing.channel).GetUsage(
            billing_pb.GetUsageRequest(
                tenant_id=tenant,
                start_time=timestamp_pb2.Timestamp(seconds=now - 7200),
                end_time=timestamp_pb2.Timestamp(seconds=now + 7200),
            )
        )
        return response.total if response.total.requests == requests else None

    result: billing_pb.UsageBucket = await wait_for(total)
    return result
