"""Prometheus view of speculative decoding, read from the torch engine at scrape time: drafts
proposed and accepted, verifications and the tokens they emitted (counters), and the acceptance
rate and tokens per verification since start (gauges; rate() of the counters gives recent ones)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llm_inference.engine.speculative import SpeculativeStats


class SpeculativeCollector(Collector):
    """Reads one engine's speculative-decoding counters on every scrape."""

    def __init__(self, model: str, stats: Callable[[], SpeculativeStats]) -> None:
        self._model = model
        self._stats = stats

    def describe(self) -> Iterable[Metric]:
        return list(self.collect())

    def collect(self) -> Iterable[Metric]:
        stats, model = self._stats(), self._model
        counters: tuple[tuple[str, str, float], ...] = (
            ("llm_inference_spec_decode_draft_tokens", "Draft tokens proposed.", stats.drafted),
            (
                "llm_inference_spec_decode_accepted_tokens",
                "Draft tokens equal to the model's own choice (kept).",
                stats.accepted,
            ),
            (
                "llm_inference_spec_decode_verifications",
                "Drafted sequence-steps verified (one forward position set each).",
                stats.steps,
            ),
            (
                "llm_inference_spec_decode_emitted_tokens",
                "Tokens emitted by verifications (accepted drafts + one per verification).",
                stats.emitted,
            ),
        )
        for name, help_text, value in counters:
            family = CounterMetricFamily(name, help_text, labels=["model_name"])
            family.add_metric([model], value)
            yield family
        gauges: tuple[tuple[str, str, float], ...] = (
            (
                "llm_inference_spec_decode_acceptance_rate",
                "Accepted / drafted tokens since start (0-1).",
                stats.acceptance,
            ),
            (
                "llm_inference_spec_decode_tokens_per_verification",
                "Tokens per verification since start; 1.0 means no gain (the speedup bound).",
                stats.tokens_per_step,
            ),
        )
        for name, help_text, value in gauges:
            gauge = GaugeMetricFamily(name, help_text, labels=["model_name"])
            gauge.add_metric([model], value)
            yield gauge
