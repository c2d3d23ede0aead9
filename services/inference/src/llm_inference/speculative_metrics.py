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
        stats = self._stats()
        counter, gauge = CounterMetricFamily, GaugeMetricFamily
        series: tuple[
            tuple[type[CounterMetricFamily | GaugeMetricFamily], str, str, float], ...
        ] = (
            (counter, "draft_tokens", "Draft tokens proposed.", stats.drafted),
            (
                counter,
                "accepted_tokens",
                "Draft tokens equal to the model's own choice (kept).",
                stats.accepted,
            ),
            (
                counter,
                "verifications",
                "Drafted sequence-steps verified (one forward position set each).",
                stats.steps,
            ),
            (
                counter,
                "emitted_tokens",
                "Tokens emitted by verifications (accepted drafts + one per verification).",
                stats.emitted,
            ),
            (
                gauge,
                "acceptance_rate",
                "Accepted / drafted tokens since start (0-1).",
                stats.acceptance,
            ),
            (
                gauge,
                "tokens_per_verification",
                "Tokens per verification since start; 1.0 means no gain (the speedup bound).",
                stats.tokens_per_step,
            ),
        )
        for kind, name, help_text, value in series:
            family = kind(f"llm_inference_spec_decode_{name}", help_text, labels=["model_name"])
            family.add_metric([self._model], value)
            yield family
