"""Fixtures: a tiny byte-level tokenizer checkpoint built at test time, and catalogues over it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from llm_common.models_config import ModelCatalog, load_catalog
from llm_common.testing import TINY_BOS, TINY_EOS, TINY_PAD, train_tiny_tokenizer

BOS, EOS, PAD = TINY_BOS, TINY_EOS, TINY_PAD
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Tokenizer:
    return train_tiny_tokenizer()


@pytest.fixture(scope="session")
def demo_tokenizer(demo_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(demo_model_dir / "tokenizer.json"))


WriteCheckpoint = Callable[..., Path]


@pytest.fixture
def write_checkpoint(tiny_tokenizer: Tokenizer, tmp_path: Path) -> WriteCheckpoint:
    """Writes tokenizer.json + tokenizer_config.json of the tiny tokenizer into tmp_path/name."""

    def write(name: str = "tiny", *, template: str | None = TEMPLATE, **config: object) -> Path:
        directory = tmp_path / name
        directory.mkdir()
        tiny_tokenizer.save(str(directory / "tokenizer.json"))
        data: dict[str, object] = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD}
        if template is not None:
            data["chat_template"] = template
        data.update(config)
        (directory / "tokenizer_config.json").write_text(json.dumps(data), encoding="utf-8")
        return directory

    return write


def write_models_yaml(path: Path, entries: dict[str, Path], context_length: int = 2048) -> Path:
    """A models.yaml with one generation model per entry (name -> checkpoint dir), each
    aliased `<name>-alias`."""
    lines = ["models:"]
    for name, checkpoint in entries.items():
        lines += [
            f"  - name: {name}",
            f"    aliases: [{name}-alias]",
            f"    checkpoint: {checkpoint}",
            f"    context_length: {context_length}",
        ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def models_yaml(tmp_path: Path) -> Callable[[dict[str, Path]], Path]:
    """Writes tmp_path/models.yaml for the given name -> checkpoint entries."""
    return lambda entries: write_models_yaml(tmp_path / "models.yaml", entries)


@pytest.fixture
def tiny_catalog(write_checkpoint: WriteCheckpoint, tmp_path: Path) -> ModelCatalog:
    """Two models: `tiny` (own template) and `plain` (no template: the default one)."""
    entries = {"tiny": write_checkpoint("tiny"), "plain": write_checkpoint("plain", template=None)}
    return load_catalog(write_models_yaml(tmp_path / "models.yaml", entries), tmp_path)
