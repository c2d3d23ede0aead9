"""Prometheus metrics: load gauges read at scrape time (vLLM-compatible names) and request
latency/token metrics recorded as requests finish."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llm_inference.engine.api import LoadSnapshot, TokenEvent

TTFT_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 60.0,
)  # fmt: skip
TPOT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5,
)  # fmt: skip
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

LoadSource = Callable[[], LoadSnapshot]


@dataclass(frozen=True, slots=True)
class _Gauge:
    name: str
    help: str
    read: Callable[[LoadSnapshot], float]


# The first three carry vLLM's exact names so KV-aware routers (llm-d, GIE) scrape them as-is.
LOAD_GAUGES = (
    _Gauge("vllm:num_requests_waiting", "Requests waiting to be scheduled.",
           lambda s: s.num_waiting),
    _Gauge("vllm:num_requests_running", "Requests in the running batch.", lambda s: s.num_running),
    _Gauge("vllm:kv_cache_usage_perc", "Fraction of KV blocks in use (0-1).",
           lambda s: s.kv_cache_usage),
    _Gauge("llm_inference_kv_blocks_capacity", "KV cache blocks in all.",
           lambda s: s.kv_blocks_total),
    _Gauge("llm_inference_kv_blocks_free", "KV cache blocks free.", lambda s: s.kv_blocks_free),
    _Gauge("llm_inference_waiting_prompt_tokens", "Prompt tokens waiting to be prefilled.",
           lambda s: s.waiting_prompt_tokens),
    _Gauge("llm_inference_running_remaining_tokens",
           "Tokens still to generate across running requests, at their max_tokens.",
           lambda s: s.running_remaining_tokens),
    _Gauge("llm_inference_tokens_per_second", "Recent generation throughput.",
           lambda s: s.tokens_per_second),
    _Gauge("llm_inference_prefix_cache_hit_rate",
           "Fraction of prompt tokens served from the prefix cache, recent window.",
           lambda s: s.prefix_cache_hit_rate),
    _Gauge("llm_inference_max_num_seqs", "Maximum concurrent sequences.",
           lambda s: s.max_num_seqs),
)  # fmt: skip


class LoadCollector(Collector):
    """Reads the backend's load on every scrape, so the gauges are never stale.

    A custom collector rather than Gauge objects: one snapshot per scrape keeps the gauges
    mutually consistent, and nothing has to poll the engine between scrapes.
    """

    def __init__(self, model: str, source: LoadSource) -> None:
        self._model = model
        self._source = source

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(g.name, g.help, labels=["model_name"]) for g in LOAD_GAUGES]

    def collect(self) -> Iterable[Metric]:
        snapshot = self._source()
        for gauge in LOAD_GAUGES:
            family = GaugeMetricFamily(gauge.name, gauge.help, labels=["model_name"])
            family.add_metric([self._model], float(gauge.read(snapshot)))
            yield family


class InferenceMetrics:
    """Request metrics of one model, bound to one registry (tests use a fresh one)."""

    def __init__(self, model: str, registry: CollectorRegistry | None = None) -> None:
        self.model = model
        self.registry = registry if registry is not None else REGISTRY
        self._load: LoadCollector | None = None
        self._extra: list[Collector] = []
        labels = ["model_name"]
        reg = self.registry
        self.ttft = Histogram(
            "llm_inference_time_to_first_token_seconds",
            "From arrival to the first generated token.",
            labels, buckets=TTFT_BUCKETS, registry=reg,
        )  # fmt: skip
        self.tpot = Histogram(
            "llm_inference_time_per_output_token_seconds",
            "Mean time between generated tokens of a request, after the first.",
            labels, buckets=TPOT_BUCKETS, registry=reg,
        )  # fmt: skip
        self.queue = Histogram(
            "llm_inference_queue_time_seconds",
            "From arrival to the first scheduled step.",
            labels, buckets=QUEUE_BUCKETS, registry=reg,
        )  # fmt: skip
        self.prompt_tokens = Counter(
            "llm_inference_prompt_tokens", "Prompt tokens of finished requests.", labels,
            registry=reg,
        )  # fmt: skip
        self.cached_tokens = Counter(
            "llm_inference_cached_prompt_tokens",
            "Prompt tokens served from the prefix cache.", labels, registry=reg,
        )  # fmt: skip
        self.generation_tokens = Counter(
            "llm_inference_generation_tokens", "Tokens generated (cancelled requests included).",
            labels, registry=reg,
        )  # fmt: skip
        self.requests = Counter(
            "llm_inference_requests", "Generation requests by finish reason.",
            [*labels, "finish_reason"], registry=reg,
        )  # fmt: skip
        self.embedded_texts = Counter(
            "llm_inference_embedded_texts", "Texts embedded.", labels, registry=reg
        )
        self.embedded_tokens = Counter(
            "llm_inference_embedded_tokens", "Tokens run through the encoder.", labels,
            registry=reg,
        )  # fmt: skip

    def watch_load(self, source: LoadSource) -> None:
        """Export `source`'s load as gauges until `unwatch_load`."""
        self.unwatch_load()
        self._load = LoadCollector(self.model, source)
        self.registry.register(self._load)

    def unwatch_load(self) -> None:
        if self._load is not None:
            self.registry.unregister(self._load)
            self._load = None
        for collector in self._extra:
            self.registry.unregister(collector)
        self._extra.clear()

    def watch(self, collector: Collector) -> None:
        """Export another scrape-time collector (e.g. the engine's grammar counters) until
        `unwatch_load`."""
        self.registry.register(collector)
        self._extra.append(collector)

    def finished(self, event: TokenEvent) -> None:
        """Record a request's last event (finish_reason set)."""
        model = self.model
        reason = event.finish_reason.value if event.finish_reason is not None else "unknown"
        self.requests.labels(model, reason).inc()
        self.prompt_tokens.labels(model).inc(event.prompt_tokens)
        self.cached_tokens.labels(model).inc(event.cached_tokens)
        self.generation_tokens.labels(model).inc(event.completion_tokens)
        timings = event.timings
        if timings is None or event.completion_tokens == 0:
            return
        self.ttft.labels(model).observe(timings.ttft_ms / 1e3)
        self.queue.labels(model).observe(timings.queue_ms / 1e3)
        if event.completion_tokens > 1:
            self.tpot.labels(model).observe(timings.decode_ms / 1e3 / (event.completion_tokens - 1))

    def abandoned(self, completion_tokens: int) -> None:
        """Record a request whose client went away before its last event."""
        self.requests.labels(self.model, "cancelled").inc()
        self.generation_tokens.labels(self.model).inc(completion_tokens)

    def embedded(self, texts: int, tokens: int) -> None:
        self.embedded_texts.labels(self.model).inc(texts)
        self.embedded_tokens.labels(self.model).inc(tokens)
