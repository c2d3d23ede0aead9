"""Wiring: clients, routing state, outbox and pipeline behind LLMService on llm_common's server."""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc

from llm_common import server as common_server
from llm_common.channels import make_channel
from llm_common.models_config import ModelCatalog, load_catalog
from llm_common.outbox import Outbox
from llm_common.resilience import AsyncBreaker
from llm_common.server import BuiltServer, ServiceSpec
from llm_common.server_tls import ServerTls
from llm_router.admission.admit import Admitter
from llm_router.admission.quota_lease import QuotaLeases
from llm_router.admission.quota_memo import UnlimitedKeys
from llm_router.api.openai_http import OpenAIHttp, start_openai_http
from llm_router.api.openai_http.in_process import InProcessLLMService
from llm_router.api.servicer import LLMServicer, ServiceDeps
from llm_router.background import Background
from llm_router.cache.near import NearCache
from llm_router.cache.near_feed import HitReporter, NearCacheFeed, NearCacheParts
from llm_router.clients.batching import BatchShape
from llm_router.clients.billing import BillingClient, SettleBatcher
from llm_router.clients.cache import CacheClient
from llm_router.clients.calls import new_breaker
from llm_router.clients.inference import InferenceClient, ReplicaChannels
from llm_router.clients.quota import QuotaClient
from llm_router.clients.tokenizer import TokenizerClient
from llm_router.config import Settings
from llm_router.embedder import Embedder
from llm_router.observability import RouterMetrics
from llm_router.pipeline import Pipeline
from llm_router.routing.discovery.fleet import Fleet
from llm_router.routing.discovery.watcher import DiscoveryWatcher, build_discovery
from llm_router.routing.dispatch import Dispatcher
from llm_router.routing.load import LoadBoard
from llm_router.routing.load_watch import LoadWatcher
from llm_router.routing.models import ModelRouter
from llm_router.routing.prefix import AffinityTable
from llm_router.routing.selection import ReplicaSelector
from llm_router.safety.policies import PolicyBook, load_policies
from llm_router.settlement.outbox import BillingSpool
from llm_router.settlement.settle import Settler
from llm_router.tokens.attestation import Attestation, AttestationWatcher
from llm_router.tokens.local import TokenizeMode, load_local
from llm_router.tokens.memo import TokenMemo
from llm_router.tokens.prompt import PromptTokenizer
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["LLMService"].full_name
# Their successful calls get the router's own access line (observability.access_log: model,
# tokens, cache, replica, timings), so the interceptor's plain `rpc` line would only repeat it.
SELF_LOGGED_METHODS = frozenset(
    f"/{SERVICE_NAME}/{m}" for m in ("Chat", "ChatStream", "Complete", "CompleteStream", "Embed")
)
OUTBOX_FILE = "billing-outbox.sqlite3"


@functools.cache
def default_router_metrics() -> RouterMetrics:
    """The process-wide RouterMetrics on the global registry, created on first use."""
    return RouterMetrics()


@dataclass
class Runtime:
    """Every long-lived part of one router, started and stopped with its server."""

    servicer: LLMServicer
    admitter: Admitter
    board: LoadBoard
    selector: ReplicaSelector
    watcher: LoadWatcher
    discovery: DiscoveryWatcher
    attesting: AttestationWatcher
    tokenizer: PromptTokenizer
    spool: BillingSpool
    settler: Settler
    leases: QuotaLeases | None
    background: Background
    settle_timeout_s: float
    channels: list[grpc.aio.Channel] = field(default_factory=list)
    replica_channels: ReplicaChannels = field(default_factory=ReplicaChannels)
    breakers: dict[str, AsyncBreaker] = field(default_factory=dict)
    http_listen: HttpListen | None = None
    region_header: str = "x-llm-region"
    http: OpenAIHttp | None = None
    near: NearCacheParts | None = None

    async def start(self) -> None:
        self.watcher.start()
        await self.discovery.start()
        if self.near is not None:
            self.near.start()
        self.attesting.start()
        self.spool.start()
        if self.http_listen is not None:
            # In-process: the HTTP layer calls this servicer, not this router's gRPC port.
            llm = InProcessLLMService(self.servicer, SELF_LOGGED_METHODS)
            listen = self.http_listen
            self.http = await start_openai_http(
                listen.host, listen.port, llm, region_header=self.region_header, tls=listen.tls
            )

    async def stop(self) -> None:
        if self.http is not None:  # no new HTTP requests while the rest drains
            await self.http.close()
        await self.discovery.stop()
        await self.watcher.stop()
        if self.near is not None:
            await self.near.stop()
        await self.attesting.stop()
        await self.tokenizer.aclose()
        # Settlements of the last requests still go out (or into the outbox) before exit:
        # the queued ones now, not after the batch wait; leases are refunded as their last
        # request settles.
        if self.leases is not None:
            self.leases.close_all()
        await self.settler.flush()
        await self.background.drain(self.settle_timeout_s * 2)
        await self.spool.stop()
        await self.spool.outbox.close()
        await self.replica_channels.close()
        for channel in self.channels:
            await channel.close()

    def spec(self) -> ServiceSpec:
        servicer = self.servicer

        def register(server: grpc.aio.Server) -> None:
            pb_grpc.add_LLMServiceServicer_to_server(servicer, server)

        return ServiceSpec(
            service_names=(SERVICE_NAME,),
            register=register,
            on_start=self.start,
            on_stop=self.stop,
            logged_methods=SELF_LOGGED_METHODS,
        )


async def build_runtime(
    settings: Settings,
    *,
    catalog: ModelCatalog | None = None,
    policies: PolicyBook | None = None,
    metrics: RouterMetrics | None = None,
    rng: random.Random | None = None,
) -> Runtime:
    """Construct the router's parts (channels do not connect until first use)."""
    catalog = catalog or load_catalog(settings.models_config, settings.model_root)
    policies = policies or load_policies(settings.policies_config)
    metrics = metrics or default_router_metrics()
    rng = rng or random.Random()
    downstream, routing = settings.downstream, settings.routing

    def breaker(name: str) -> AsyncBreaker:
        return new_breaker(
            f"router-{name}",
            fail_max=downstream.breaker_fail_max,
            reset_s=downstream.breaker_reset_s,
        )

    breakers = {"billing": breaker("billing"), "auth": breaker("auth"), "cache": breaker("cache")}
    channels: list[grpc.aio.Channel] = []

    def channel(addr: str) -> grpc.aio.Channel:
        made = make_channel(
            addr,
            max_message_bytes=settings.server.max_message_bytes,
            retry_unavailable=downstream.channel_retries,
            tls=settings.server.tls,
        )
        channels.append(made)
        return made

    memo = TokenMemo(settings.token_memo) if settings.token_memo.max_tokens > 0 else None
    local = await asyncio.to_thread(load_local, catalog, settings.tokenize)
    speculate = settings.tokenize is TokenizeMode.SPECULATE
    attestation = None
    if speculate and local is not None:
        fingerprints = {name: model.fingerprint for name, model in local.models.items()}
        attestation = Attestation(
            fingerprints,
            settings.attestation,
            attested_gauge=metrics.tokenizer_attested,
            audits=metrics.tokenizer_audits,
            rng=rng,
        )
    tokenizer_service = TokenizerClient(
        channel(downstream.tokenizer_addr), downstream.call_timeout_s
    )
    tokenizer = PromptTokenizer(
        tokenizer_service,
        memo,
        metrics.token_memo,
        local=None if speculate else local,
        speculative=local if speculate else None,
        attestation=attestation,
    )
    reserve_batch = None
    if downstream.reserve_batch_max > 0:
        reserve_batch = BatchShape(
            downstream.reserve_batch_max,
            downstream.reserve_batch_wait_ms / 1000,
            downstream.reserve_batch_in_flight,
        )
    billing = BillingClient(
        channel(downstream.billing_addr),
        downstream.call_timeout_s,
        breakers["billing"],
        reserve_batch=reserve_batch,
    )
    quota = None
    if downstream.auth_addr is not None:
        quota = QuotaClient(
            channel(downstream.auth_addr), downstream.call_timeout_s, breakers["auth"]
        )
    cache = None
    near = None
    if downstream.cache_addr is not None:
        cache = CacheClient(
            channel(downstream.cache_addr), downstream.call_timeout_s, breakers["cache"]
        )
        if settings.near_cache.enabled:
            near = _near_cache(settings, cache, metrics, rng)

    outbox = await Outbox.open(settings.outbox_dir / OUTBOX_FILE)
    spool = BillingSpool(
        outbox,
        billing,
        timeout_s=downstream.settle_timeout_s,
        metrics=metrics,
        batch_max=downstream.settle_batch_max,
    )
    background = Background()
    batcher = None
    if downstream.settle_batch_max > 0:
        batcher = SettleBatcher(
            billing.settle_batch,
            max_items=downstream.settle_batch_max,
            wait_s=downstream.settle_batch_wait_ms / 1000,
            timeout_s=downstream.settle_timeout_s,
            max_in_flight=downstream.settle_batch_in_flight,
            linger_s=downstream.settle_batch_linger_ms / 1000,
            span_name="router.settle_batch",
        )
    leases = None
    if quota is not None and settings.leases.lease_s > 0:
        leases = QuotaLeases(
            quota,
            settings.leases,
            background=background,
            events=metrics.quota_leases,
            refund_timeout_s=downstream.settle_timeout_s,
        )
    settler = Settler(
        billing,
        quota,
        spool,
        timeout_s=downstream.settle_timeout_s,
        metrics=metrics,
        background=background,
        batcher=batcher,
        leases=leases,
    )
    admitter = Admitter(
        quota,
        billing,
        settler,
        metrics,
        quota_fail_open=downstream.quota_fail_open,
        unlimited=UnlimitedKeys(downstream.quota_unlimited_ttl_s),
        unbudgeted=UnlimitedKeys(downstream.billing_unbudgeted_ttl_s),
        leases=leases,
    )

    router = ModelRouter(catalog, home_region=routing.region, rng=rng)
    board = LoadBoard(
        exclude_s=routing.exclude_s,
        exclude_max_s=routing.exclude_max_s,
        stale_s=routing.load_stale_s,
    )
    affinity = AffinityTable(max_entries=routing.affinity_entries, ttl_s=routing.affinity_ttl_s)
    selector = ReplicaSelector(board, affinity, routing, rng)
    replica_channels = ReplicaChannels(
        mesh_addr=routing.mesh_addr, mesh_header=routing.mesh_header, tls=settings.server.tls
    )
    inference = InferenceClient(replica_channels)
    fleet = Fleet()
    dispatcher = Dispatcher(selector, board, inference, routing, metrics, rng=rng, fleet=fleet)
    watcher = LoadWatcher(
        inference, board, selector, router.replicas(), interval_ms=routing.load_interval_ms, rng=rng
    )
    discovery = build_discovery(catalog, inference, fleet, watcher)

    pipeline = Pipeline(
        router=router,
        policies=policies,
        tokenizer=tokenizer,
        admitter=admitter,
        cache=cache,
        dispatcher=dispatcher,
        settler=settler,
        background=background,
        metrics=metrics,
        overlap_admission=downstream.overlap_admission,
        lookup_grace_s=downstream.lookup_grace_s,
        speculate_below_hit_rate=downstream.speculate_below_hit_rate,
        near=near,
    )
    embedder = Embedder(
        router=router,
        policies=policies,
        admitter=admitter,
        dispatcher=dispatcher,
        settler=settler,
        metrics=metrics,
    )
    deps = ServiceDeps(
        pipeline=pipeline,
        embedder=embedder,
        router=router,
        tokenizer=tokenizer,
        policies=policies,
        background=background,
        limits=settings.limits,
        region_header=routing.region_header,
        request_timeout_s=downstream.request_timeout_s,
    )
    return Runtime(
        servicer=LLMServicer(deps),
        admitter=admitter,
        board=board,
        selector=selector,
        watcher=watcher,
        discovery=discovery,
        attesting=AttestationWatcher(attestation, tokenizer_service.fingerprint),
        tokenizer=tokenizer,
        spool=spool,
        settler=settler,
        leases=leases,
        background=background,
        settle_timeout_s=downstream.settle_timeout_s,
        channels=channels,
        replica_channels=replica_channels,
        breakers=breakers,
        http_listen=_http_listen(settings),
        region_header=routing.region_header,
        near=near,
    )


def _near_cache(
    settings: Settings, cache: CacheClient, metrics: RouterMetrics, rng: random.Random
) -> NearCacheParts:
    near = NearCache(settings.near_cache)
    feed = NearCacheFeed(cache, near, metrics.near_cache, rng=rng)
    reporter = HitReporter(
        cache,
        metrics.near_cache,
        interval_s=settings.near_cache.report_interval_s,
        timeout_s=settings.downstream.settle_timeout_s,
    )
    return NearCacheParts(near, feed, reporter)


@dataclass(frozen=True, slots=True)
class HttpListen:
    """Where the OpenAI listener binds."""

    host: str
    port: int
    tls: ServerTls | None = None  # GRPC_TLS_*: callers need a mesh certificate here too


def _http_listen(settings: Settings) -> HttpListen | None:
    if settings.http_port is None:
        return None
    return HttpListen(settings.http_host, settings.http_port, settings.server.tls)


async def serve(
    settings: Settings,
    *,
    stop: asyncio.Event | None = None,
    ready: Callable[[BuiltServer], None] | None = None,
) -> None:
    """Serve LLMService until SIGTERM/SIGINT (or `stop`), then drain and settle."""
    runtime = await build_runtime(settings)
    await common_server.serve(settings.server, runtime.spec(), stop=stop, ready=ready)
