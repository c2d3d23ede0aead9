"""bench_engine's speculation ceiling: greedy outputs replayed through prompt-lookup settings.

Speedup is at most tokens per verification (when verifying costs no more than a plain step).
Replaying the plain run's greedy outputs through a grid of drafter settings gives the best
tokens per step any of them reaches on this model and workload, with no engine in the loop:
what the drafter could win, separate from what verification costs.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llm_inference.engine.speculative import next_draft_limit, propose

NGRAM_MAX = (2, 3, 4, 6, 8)
NGRAM_MIN = (1, 2, 3)
DRAFT_CAP = (2, 4, 6, 8, 12)


@dataclass(frozen=True, slots=True)
class Setting:
    ngram_max: int
    ngram_min: int
    draft_cap: int


def tokens_per_step(
    prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]], setting: Setting
) -> float:
    """Tokens per verification if the engine drafted with `setting` (adaptive lengths as the
    engine's next_draft_limit) and the model emitted `outputs` greedily."""
    steps = emitted = 0
    for prompt, output in zip(prompts, outputs, strict=True):
        sequence, i, limit = [*prompt, output[0]], 1, 0
        while i < len(output):
            room = min(len(output) - i - 1, limit or setting.draft_cap)
            draft = propose(sequence, room, setting.ngram_max, setting.ngram_min)
            accepted = 0
            while accepted < len(draft) and draft[accepted] == output[i + accepted]:
                accepted += 1
            if draft:
                limit = next_draft_limit(limit, len(draft), accepted, setting.draft_cap)
            sequence += output[i : i + accepted + 1]
            i += accepted + 1
            steps += 1
            emitted += accepted + 1
    return emitted / steps if steps else 0.0


def lookup_ceiling(
    prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]
) -> dict[str, Any]:
    """The best tokens per step over the settings grid, and the setting that reaches it."""
    grid = [
        Setting(high, low, cap)
        for high, low, cap in itertools.product(NGRAM_MAX, NGRAM_MIN, DRAFT_CAP)
        if low <= high
    ]
    scored = [(tokens_per_step(prompts, outputs, s), s) for s in grid]
    best, setting = max(scored, key=lambda pair: pair[0])
    return {
        "settings_tried": len(grid),
        "best_tokens_per_step": best,
        "best_setting": {
            "ngram_max": setting.ngram_max,
            "ngram_min": setting.ngram_min,
            "draft_cap": setting.draft_cap,
        },
    }
