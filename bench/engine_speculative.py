"""bench_engine's speculative decoding: prompt lookup on a repetitive workload, on vs off.

Code and JSON editing prompts (the answer repeats most of the prompt) run greedy through
the chat template, one request at a time (the latency case speculation is for), with
speculative decoding off and on; the outputs must be token-identical. Run on the trained
demo-chat model (random-weight models do not copy their prompt, so lookups rarely hit: their
figure is reported too, under "random_model").
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine_decode import step_rows_ms
from engine_spec_replay import lookup_ceiling

from llm_inference.engine.api import SamplingOptions
from llm_inference.engine.config import EngineConfig
from llm_inference.engine.core import EngineCore

RECORDS = (
    '{"id": 17, "name": "widget", "tags": ["red", "small"], "price": 12.5, "stock": 40}',
    '{"user": "ada", "roles": ["admin", "dev"], "active": true, "quota": {"cpu": 4, "gpu": 0}}',
    '{"city": "Lyon", "temps": [3.5, 4.1, 6.0, 7.2], "unit": "C", "source": "station-12"}',
)
CODE = (
    "def total(items):\n    result = 0\n    for item in items:\n        result += item.price\n"
    "    return result\n",
    "for user in users:\n    if user.active:\n        send(user.email, subject, body)\n"
    "        log.info('sent to %s', user.name)\n",
)
EDITS = ("Rename {a} to {b} in this and return it unchanged otherwise:\n", "Fix the typo:\n")
MAX_TOKENS = 128


@dataclass(frozen=True, slots=True)
class SpecRun:
    outputs: list[list[int]]
    seconds: float
    steps: int


def editing_prompts(core: EngineCore) -> list[list[int]]:
    """Chat-formatted editing requests whose answers should copy the given text."""
    tok = core.tokenizer
    assert tok is not None
    texts = []
    for i, body in enumerate(RECORDS + CODE):
        ask = EDITS[i % 2].format(a="name", b="label") + body + "\n" + body
        texts.append(f"<|bos|><|user|>\n{ask}<|eos|>\n<|assistant|>\n{body[:12]}")
    return [list(tok.encode(t, add_special_tokens=False).ids) for t in texts]  # type: ignore[attr-defined]


def _run(core: EngineCore, prompts: Sequence[list[int]]) -> SpecRun:
    # EOS ignored: fixed lengths, and the small model then repeats itself as long answers do.
    options = SamplingOptions(
        temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False
    )
    outputs: list[list[int]] = []
    steps = core.num_steps
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        core.add_request(f"spec-{i}", prompt, options)
        tokens: list[int] = []
        while core.has_work:
            for emitted in core.step():
                tokens.extend(emitted.event.token_ids)
        outputs.append(tokens)
    return SpecRun(outputs, time.perf_counter() - start, core.num_steps - steps)


def bench_speculative(model_dir: Path, draft_tokens: int, rounds: int) -> dict[str, Any]:
    """Off vs on, interleaved `rounds` times; the best round of each side counts."""
    config = EngineConfig(kv_cache_memory_bytes=128 << 20)
    plain = EngineCore.from_checkpoint(model_dir, config, "plain")
    spec = EngineCore.from_checkpoint(
        model_dir, EngineConfig(kv_cache_memory_bytes=128 << 20, speculative_tokens=draft_tokens),
        "spec",
    )  # fmt: skip
    prompts = editing_prompts(plain)
    _run(plain, prompts[:1]), _run(spec, prompts[:1])  # warm-up
    base = spec.speculative_stats.drafted, spec.speculative_stats.accepted
    plain_runs, spec_runs = [], []
    for _ in range(rounds):
        plain_runs.append(_run(plain, prompts))
        spec_runs.append(_run(spec, prompts))
    best_plain = min(plain_runs, key=lambda r: r.seconds)
    best_spec = min(spec_runs, key=lambda r: r.seconds)
    stats = spec.speculative_stats
    drafted, accepted = stats.drafted - base[0], stats.accepted - base[1]
    tokens = sum(len(o) for o in best_spec.outputs)
    return {
        "model": model_dir.name,
        "requests": len(prompts),
        "concurrency": 1,
        "draft_tokens": draft_tokens,
        "output_tokens": tokens,
        "seconds_off": best_plain.seconds,
        "seconds_on": best_spec.seconds,
        "steps_off": best_plain.steps,
        "steps_on": best_spec.steps,
        "speedup": best_plain.seconds / best_spec.seconds,
        "identical_greedy_output": all(
            r.outputs == plain_runs[0].outputs for r in plain_runs + spec_runs
        ),
        "acceptance": accepted / drafted if drafted else 0.0,
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "tokens_per_step_on": tokens / best_spec.steps if best_spec.steps else 0.0,
        # What a verification costs: a step of 1 row vs 1 + draft rows (context 256). The
        # speedup is at most tokens_per_step_on / this ratio (when per-step overhead is nil).
        "step_ms_by_rows": step_rows_ms(plain, (1, 1 + draft_tokens)),
        # The most any prompt-lookup setting could emit per step on these outputs: the
        # speedup's ceiling when verification is free (engine_spec_replay).
        "lookup_ceiling": lookup_ceiling(prompts, best_plain.outputs),
    }
