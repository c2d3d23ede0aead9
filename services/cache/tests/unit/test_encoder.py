"""The plain-torch BERT encoder against sentence-transformers on the same checkpoint."""

from __future__ import annotations

import numpy as np
import pytest

from llm_cache.encoder import Encoder, EncoderLoadError

TEXTS = [
    "How can I become a software engineer at Google?",
    "What are the best headphones under Rs. 2000 in India?",
    "",
    "a",
    "Ünïcödé façade — naïve café, 日本語のテキスト and emoji 👍🏽",
    "The quick brown fox jumps over the lazy dog. " * 5,
]


@pytest.fixture(scope="module")
def reference(encoder: Encoder, monkeypatch_module: pytest.MonkeyPatch) -> object:
    monkeypatch_module.setenv("HF_HUB_OFFLINE", "1")  # never reach a network
    monkeypatch_module.setenv("TRANSFORMERS_OFFLINE", "1")
    sentence_transformers = pytest.importorskip("sentence_transformers")
    return sentence_transformers.SentenceTransformer(str(encoder.model_dir), device="cpu")


@pytest.fixture(scope="module")
def monkeypatch_module() -> object:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_embeddings_equal_sentence_transformers(encoder: Encoder, reference) -> None:
    ours = encoder.encode(TEXTS).vectors
    theirs = reference.encode(TEXTS, batch_size=4, convert_to_numpy=True)

    assert ours.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_long_texts_are_flagged_and_still_match(encoder: Encoder, reference) -> None:
    long_text = "word " * 400  # past the 256-token window
    encoded = encoder.encode([long_text, "short"])

    assert encoded.truncated == (True, False)
    theirs = reference.encode([long_text], convert_to_numpy=True)
    np.testing.assert_allclose(encoded.vectors[:1], theirs, atol=1e-4)


def test_batching_does_not_change_a_text_s_embedding(encoder: Encoder) -> None:
    batched = encoder.encode(TEXTS).vectors
    single = np.stack([encoder.encode([t]).vectors[0] for t in TEXTS])

    np.testing.assert_allclose(batched, single, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)


def test_nothing_to_encode(encoder: Encoder) -> None:
    assert encoder.encode([]).vectors.shape == (0, 384)


def test_a_directory_without_a_model_is_refused(tmp_path) -> None:
    with pytest.raises(EncoderLoadError, match=r"tokenizer\.json"):
        Encoder(tmp_path)
