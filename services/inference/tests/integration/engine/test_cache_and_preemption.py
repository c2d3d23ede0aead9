"""Prefix-cache hits and preemption with recompute never change greedy outputs."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from llm_inference.engine.api import SamplingOptions

LAYOUT = "llama-gqa-untied"


def _shared_prefix_requests(kit: Any, greedy: Callable[[int], SamplingOptions]) -> list[Any]:
    system = kit.random_prompts(10, [37])[0]
    tails = kit.random_prompts(11, [5, 12, 1, 20, 9, 3])
    return [(f"p{i}", system + tail, greedy(14 + i)) for i, tail in enumerate(tails)]


def test_prefix_cache_hits_do_not_change_outputs(
    checkpoints: Callable[[str], Path],
    hf_models: Any,
    kit: Any,
    greedy: Callable[[int], SamplingOptions],
) -> None:
    path = checkpoints(LAYOUT)
    requests = _shared_prefix_requests(kit, greedy)
    uncached = kit.run_to_completion(kit.make_core(path, enable_prefix_caching=False), requests)
    core = kit.make_core(path)
    # The first request warms the cache; the rest then hit it, one by one and all at once.
    first = kit.run_to_completion(core, requests[:1])
    one_by_one = {**first}
    for request in requests[1:3]:
        one_by_one.update(kit.run_to_completion(core, [request]))
    hits_before = core.block_manager.hit_tokens
    assert hits_before >= 2 * 36  # both later requests reused the 9 full blocks of the prefix
    together = kit.run_to_completion(core, [(f"again-{rid}", p, s) for rid, p, s in requests])
    assert core.block_manager.hit_tokens > hits_before
    hf = hf_models(path)
    for rid, prompt, sampling in requests:
        expected = kit.hf_greedy(hf, prompt, sampling.max_tokens)
        assert uncached[rid] == expected
        assert together[f"again-{rid}"] == expected
        if rid in one_by_one:
            assert one_by_one[rid] == expected


def test_identical_prompt_is_never_served_fully_from_cache(
    checkpoints: Callable[[str], Path], kit: Any, greedy: Callable[[int], SamplingOptions]
) -> None:
    core = kit.make_core(checkpoints(LAYOUT))
    prompt = kit.random_prompts(12, [16])[0]  # exactly 4 full blocks of 4 tokens
    first = kit.run_to_completion(core, [("a", prompt, greedy(6))])
    core.add_request("b", prompt, greedy(6))
    seq = core.scheduler.get("b")
    events = []
    while core.has_work:
        events.extend(e.event for e in core.step())
    assert seq is not None
    assert seq.num_cached_tokens == 12
    assert events[-1].cached_tokens == 12
    assert [t for e in events for t in e.token_ids] == first["a"]


def test_preemption_by_recompute_keeps_outputs(
    checkpoints: Callable[[str], Path],
    hf_models: Any,
    kit: Any,
    greedy: Callable[[int], SamplingOptions],
) -> None:
    path = checkpoints(LAYOUT)
    prompts = kit.random_prompts(13, [30, 22, 41, 17, 35])
    requests = [(f"q{i}", p, greedy(40)) for i, p in enumerate(prompts)]
    # 2 layers x 2 KV heads x 16 dims x 4 B x 2 (K, V) x 4 tokens = 2 KiB per block; 40 blocks
    # hold 160 tokens, far less than the ~350 the five requests reach together.
    for caching in (True, False):
        core = kit.make_core(path, kv_cache_memory_bytes=40 * 2048, enable_prefix_caching=caching)
        assert core.block_manager.num_blocks == 40
        outputs = kit.run_to_completion(core, requests)
        assert core.scheduler.num_preemptions > 0
        assert core.block_manager.num_free_blocks == 40
        hf = hf_models(path)
        for rid, prompt, sampling in requests:
            assert outputs[rid] == kit.hf_greedy(hf, prompt, sampling.max_tokens), rid
