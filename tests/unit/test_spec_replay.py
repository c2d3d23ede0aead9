"""bench-engine's speculation ceiling (bench/engine_spec_replay.py): replaying greedy outputs
through prompt-lookup settings counts what the engine's drafter would emit per step."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def replay(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    return importlib.import_module("engine_spec_replay")


def test_text_never_seen_before_gets_one_token_a_step(replay: ModuleType) -> None:
    prompt, output = list(range(10, 40)), list(range(100, 160))
    setting = replay.Setting(3, 1, 4)
    assert replay.tokens_per_step([prompt], [output], setting) == 1.0


def test_copying_the_prompt_is_drafted_in_long_runs(replay: ModuleType) -> None:
    body = [(7 * i) % 97 + 3 for i in range(80)]  # no repeated bigram within it
    prompt, output = [1, 2, *body, 2], [1, *body]  # the answer gives the body back
    copied = replay.tokens_per_step([prompt], [output], replay.Setting(3, 1, 8))
    capped = replay.tokens_per_step([prompt], [output], replay.Setting(3, 1, 2))
    assert copied > 4.0
    assert 2.0 < capped <= 3.0  # at most two drafts and the model's own token a step
    ceiling = replay.lookup_ceiling([prompt], [output])
    assert ceiling["best_tokens_per_step"] >= copied
    assert ceiling["settings_tried"] == 70
