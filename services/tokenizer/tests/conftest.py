"""Fixtures: a tiny byte-level tokenizer checkpoint built at test time, and catalogues over it."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from llm_common.models_config import ModelCatalog, load_catalog
from llm_testing import train_tiny_tokenizer, write_models_yaml, write_tiny_checkpoint


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Tokenizer:
    return train_tiny_tokenizer()


@pytest.fixture(scope="session")
def demo_tokenizer(demo_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(demo_model_dir / "tokenizer.json"))


@pytest.fixture
def tiny_catalog(tiny_tokenizer: Tokenizer, tmp_path: Path) -> ModelCatalog:
    """Two models: `tiny` (own template) and `plain` (no template: the default one)."""
    entries = {
        "tiny": write_tiny_checkpoint(tmp_path / "tiny", tiny_tokenizer),
        "plain": write_tiny_checkpoint(tmp_path / "plain", tiny_tokenizer, template=None),
    }
    return load_catalog(write_models_yaml(tmp_path / "models.yaml", entries), tmp_path)
