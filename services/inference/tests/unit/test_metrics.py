"""Prometheus exposition: vLLM-compatible gauge names read at scrape time, request metrics."""

from __future__ import annotations

import re

from prometheus_client import CollectorRegistry, generate_latest

from llm_inference.engine.api import FinishReason, LoadSnapshot, RequestTimings, TokenEvent
from llm_inference.metrics import InferenceMetrics

VLLM_NAMES = ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc")


def snapshot(waiting: int, running: int, free: int) -> LoadSnapshot:
    return LoadSnapshot(
        num_waiting=waiting, num_running=running, kv_blocks_total=100, kv_blocks_free=free,
        kv_cache_usage=(100 - free) / 100, waiting_prompt_tokens=40, running_remaining_tokens=9,
        tokens_per_second=12.5, prefix_cache_hit_rate=0.25, max_num_seqs=64,
    )  # fmt: skip


def samples(text: str) -> dict[str, float]:
    """metric name{labels} -> value, for every sample line."""
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            found[key] = float(value)
    return found


def test_load_gauges_use_the_exact_vllm_names_and_are_read_per_scrape() -> None:
    registry = CollectorRegistry()
    metrics = InferenceMetrics("demo", registry)
    current = [snapshot(3, 2, 75)]
    metrics.watch_load(lambda: current[0])
    text = generate_latest(registry).decode()
    names = set(re.findall(r"^# TYPE (\S+) gauge$", text, flags=re.MULTILINE))
    assert set(VLLM_NAMES) <= names
    values = samples(text)
    assert values['vllm:num_requests_waiting{model_name="demo"}'] == 3
    assert values['vllm:num_requests_running{model_name="demo"}'] == 2
    assert values['vllm:kv_cache_usage_perc{model_name="demo"}'] == 0.25
    assert values['llm_inference_kv_blocks_free{model_name="demo"}'] == 75
    assert values['llm_inference_tokens_per_second{model_name="demo"}'] == 12.5
    current[0] = snapshot(0, 1, 100)
    values = samples(generate_latest(registry).decode())
    assert values['vllm:num_requests_waiting{model_name="demo"}'] == 0
    assert values['vllm:kv_cache_usage_perc{model_name="demo"}'] == 0.0
    metrics.unwatch_load()
    assert "vllm:" not in generate_latest(registry).decode()


def test_finished_requests_feed_histograms_and_counters() -> None:
    registry = CollectorRegistry()
    metrics = InferenceMetrics("demo", registry)
    event = TokenEvent(
        token_ids=(5,), text_delta="", logprobs=None, finish_reason=FinishReason.LENGTH,
        prompt_tokens=10, completion_tokens=5, cached_tokens=4,
        timings=RequestTimings(queue_ms=2.0, prefill_ms=8.0, ttft_ms=20.0, decode_ms=40.0),
    )  # fmt: skip
    metrics.finished(event)
    metrics.abandoned(3)
    metrics.embedded(2, 17)
    values = samples(generate_latest(registry).decode())
    label = '{model_name="demo"}'
    assert values[f"llm_inference_prompt_tokens_total{label}"] == 10
    assert values[f"llm_inference_cached_prompt_tokens_total{label}"] == 4
    assert values[f"llm_inference_generation_tokens_total{label}"] == 8
    assert values['llm_inference_requests_total{finish_reason="length",model_name="demo"}'] == 1
    assert values['llm_inference_requests_total{finish_reason="cancelled",model_name="demo"}'] == 1
    assert values[f"llm_inference_time_to_first_token_seconds_sum{label}"] == 0.02
    # 40 ms over the 4 tokens after the first.
    assert values[f"llm_inference_time_per_output_token_seconds_sum{label}"] == 0.01
    assert values[f"llm_inference_queue_time_seconds_count{label}"] == 1
    assert values[f"llm_inference_embedded_texts_total{label}"] == 2
    assert values[f"llm_inference_embedded_tokens_total{label}"] == 17


def test_speculative_counters_and_rates_are_read_per_scrape() -> None:
    from llm_inference.engine.speculative import SpeculativeStats
    from llm_inference.speculative_metrics import SpeculativeCollector

    registry = CollectorRegistry()
    metrics = InferenceMetrics("demo", registry)
    stats = SpeculativeStats(steps=10, drafted=40, accepted=30, emitted=40)
    metrics.watch(SpeculativeCollector("demo", lambda: stats))
    values = samples(generate_latest(registry).decode())
    assert values['llm_inference_spec_decode_draft_tokens_total{model_name="demo"}'] == 40
    assert values['llm_inference_spec_decode_accepted_tokens_total{model_name="demo"}'] == 30
    assert values['llm_inference_spec_decode_acceptance_rate{model_name="demo"}'] == 0.75
    assert values['llm_inference_spec_decode_tokens_per_verification{model_name="demo"}'] == 4.0
    stats.accepted = 31
    values = samples(generate_latest(registry).decode())
    assert values['llm_inference_spec_decode_accepted_tokens_total{model_name="demo"}'] == 31
    metrics.unwatch_load()
    assert "spec_decode" not in generate_latest(registry).decode()
