"""Fixtures: a tiny byte-level tokenizer checkpoint built at test time, and catalogues over it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from llm_common.models_config import ModelCatalog, load_catalog
from llm_testing import (
    TINY_CHAT_TEMPLATE,
    train_tiny_tokenizer,
    write_models_yaml,
    write_tiny_checkpoint,
)

WriteCheckpoint = Callable[..., Path]


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Tokenizer:
    return train_tiny_tokenizer()


@pytest.fixture
def write_checkpoint(tiny_tokenizer: Tokenizer, tmp_path: Path) -> WriteCheckpoint:
    """Writes tokenizer.json + tokenizer_config.json of the tiny tokenizer into tmp_path/name."""

    def write(
        name: str = "tiny", *, template: str | None = TINY_CHAT_TEMPLATE, **config: object
    ) -> Path:
        return write_tiny_checkpoint(tmp_path / name, tiny_tokenizer, template=template, **config)

    return write


@pytest.fixture
def models_yaml(tmp_path: Path) -> Callable[[dict[str, Path]], Path]:
    """Writes tmp_path/models.yaml for the given name -> checkpoint entries."""
    return lambda entries: write_models_yaml(tmp_path / "models.yaml", entries)


@pytest.fixture
def tiny_catalog(write_checkpoint: WriteCheckpoint, tmp_path: Path) -> ModelCatalog:
    """Two models: `tiny` (own template) and `plain` (no template: the default one)."""
    entries = {"tiny": write_checkpoint("tiny"), "plain": write_checkpoint("plain", template=None)}
    return load_catalog(write_models_yaml(tmp_path / "models.yaml", entries), tmp_path)
