"""Prometheus view of constrained decoding, read from the torch engine at scrape time: grammar
compilations (cache hits and misses), rows masked, samples the grammar overrode, and recent
mask and compile times as quantile gauges (the engine keeps the last steps in ring buffers)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llm_inference.engine.grammar import CompileStats
from llm_inference.engine.grammar_mask import GrammarStats

QUANTILES = (0.5, 0.99)


class GrammarCollector(Collector):
    """Reads one engine's grammar counters on every scrape."""

    def __init__(
        self,
        model: str,
        masks: Callable[[], GrammarStats],
        compiles: Callable[[], CompileStats],
    ) -> None:
        self._model = model
        self._masks = masks
        self._compiles = compiles

    def describe(self) -> Iterable[Metric]:
        return list(self.collect())

    def collect(self) -> Iterable[Metric]:
        masks, compiles, model = self._masks(), self._compiles(), self._model
        compiled = CounterMetricFamily(
            "llm_inference_grammar_compiles",
            "Output-format compilations asked for, by result (hit: cached or in flight).",
            labels=["model_name", "result"],
        )
        compiled.add_metric([model, "hit"], compiles.hits)
        compiled.add_metric([model, "miss"], compiles.misses)
        yield compiled
        yield _counter("llm_inference_grammar_masked_rows", "Rows masked by a grammar.", model,
                       masks.masked_rows)  # fmt: skip
        yield _counter(
            "llm_inference_grammar_overridden",
            "Samples the grammar rejected and replaced by its most likely allowed token.",
            model, masks.overridden,
        )  # fmt: skip
        yield _quantiles("llm_inference_grammar_mask_ms",
                         "Mask time per step over recent steps, milliseconds.", model,
                         list(masks.mask_ms))  # fmt: skip
        yield _quantiles("llm_inference_grammar_compile_ms",
                         "Compile time over recent compilations, milliseconds.", model,
                         list(compiles.compile_ms))  # fmt: skip


def _counter(name: str, help_text: str, model: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(name, help_text, labels=["model_name"])
    family.add_metric([model], value)
    return family


def _quantiles(name: str, help_text: str, model: str, samples: Sequence[float]) -> Metric:
    family = GaugeMetricFamily(name, help_text, labels=["model_name", "quantile"])
    ordered = sorted(samples)
    for q in QUANTILES:
        value = ordered[min(int(q * len(ordered)), len(ordered) - 1)] if ordered else 0.0
        family.add_metric([model, f"{q:g}"], value)
    return family
