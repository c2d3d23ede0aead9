"""Tokenizer fingerprints: equal for the same files and code, different when anything that
decides the ids differs (what lets the router trust its own ids, see TokenizerService.Info)."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from llm_common.models_config import ModelSpec
from llm_common.tokenization.fingerprint import fingerprint
from llm_common.tokenization.registry import (
    CHAT_TEMPLATE_FILE,
    TOKENIZER_FILES,
    load_model,
)

WriteCheckpoint = Callable[..., Path]


def loaded(checkpoint: Path) -> str:
    return load_model(ModelSpec(name="tiny", checkpoint=checkpoint, context_length=512)).fingerprint


def test_same_files_anywhere_give_the_same_fingerprint(
    write_checkpoint: WriteCheckpoint, tmp_path: Path
) -> None:
    original = write_checkpoint("a")
    copy = tmp_path / "elsewhere"
    shutil.copytree(original, copy)
    assert loaded(original) == loaded(copy)  # the path is not part of it
    assert len(loaded(original)) == 32


def test_a_different_template_changes_it(write_checkpoint: WriteCheckpoint) -> None:
    plain = write_checkpoint("plain", template=None)
    templated = write_checkpoint("templated")
    assert loaded(plain) != loaded(templated)


def test_every_file_load_model_reads_counts(write_checkpoint: WriteCheckpoint) -> None:
    checkpoint = write_checkpoint()
    before = fingerprint(checkpoint, TOKENIZER_FILES)
    # A separate template file takes precedence over tokenizer_config.json's: it counts even
    # where it did not exist before (absent differs from empty).
    (checkpoint / CHAT_TEMPLATE_FILE).write_text("", encoding="utf-8")
    assert fingerprint(checkpoint, TOKENIZER_FILES) != before
    (checkpoint / CHAT_TEMPLATE_FILE).unlink()
    assert fingerprint(checkpoint, TOKENIZER_FILES) == before
    tokenizer_json = checkpoint / TOKENIZER_FILES[0]
    tokenizer_json.write_bytes(tokenizer_json.read_bytes() + b" ")
    assert fingerprint(checkpoint, TOKENIZER_FILES) != before


def test_file_boundaries_are_unambiguous(tmp_path: Path) -> None:
    # Moving bytes from one file to the next must not give the same digest.
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    (one / "a").write_bytes(b"xy")
    (one / "b").write_bytes(b"z")
    (two / "a").write_bytes(b"x")
    (two / "b").write_bytes(b"yz")
    assert fingerprint(one, ("a", "b")) != fingerprint(two, ("a", "b"))
