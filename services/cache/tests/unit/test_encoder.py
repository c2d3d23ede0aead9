"""The plain-torch BERT encoder against sentence-transformers on the same checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from llm_cache.encoder import Encoder, EncoderLoadError, default_model_dir

TEXTS = [
    "How can I become a software engineer at Google?",
    "What are the best headphones under Rs. 2000 in India?",
    "",
    "a",
    "Ünïcödé façade — naïve café, 日本語のテキスト and emoji 👍🏽",
    "The quick brown fox jumps over the lazy dog. " * 5,
]


@pytest.fixture(scope="module")
def float32_encoder() -> Encoder:
    return Encoder(default_model_dir(), dtype=torch.float32)


@pytest.fixture(scope="module")
def reference(float32_encoder: Encoder, monkeypatch_module: pytest.MonkeyPatch) -> object:
    monkeypatch_module.setenv("HF_HUB_OFFLINE", "1")  # never reach a network
    monkeypatch_module.setenv("TRANSFORMERS_OFFLINE", "1")
    sentence_transformers = pytest.importorskip("sentence_transformers")
    return sentence_transformers.SentenceTransformer(str(float32_encoder.model_dir), device="cpu")


@pytest.fixture(scope="module")
def monkeypatch_module() -> object:
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_embeddings_equal_sentence_transformers(float32_encoder: Encoder, reference) -> None:
    ours = float32_encoder.encode(TEXTS).vectors
    theirs = reference.encode(TEXTS, batch_size=4, convert_to_numpy=True)

    assert ours.shape == (len(TEXTS), 384)
    np.testing.assert_allclose(ours, theirs, atol=1e-4)


def test_long_texts_are_flagged_and_still_match(float32_encoder: Encoder, reference) -> None:
    long_text = "word " * 400  # past the 256-token window
    encoded = float32_encoder.encode([long_text, "short"])

    assert encoded.truncated == (True, False)
    theirs = reference.encode([long_text], convert_to_numpy=True)
    np.testing.assert_allclose(encoded.vectors[:1], theirs, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batching_does_not_change_a_text_s_embedding(dtype: torch.dtype) -> None:
    encoder = Encoder(default_model_dir(), dtype=dtype)
    batched = encoder.encode(TEXTS).vectors
    single = np.stack([encoder.encode([t]).vectors[0] for t in TEXTS])

    # bfloat16 rounds per operation, and padding changes the shapes it rounds in.
    np.testing.assert_allclose(
        np.sum(batched * single, axis=1), 1.0, atol=1e-5 if dtype == torch.float32 else 1e-3
    )
    np.testing.assert_allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)


def test_bfloat16_embeddings_stay_close_to_float32(float32_encoder: Encoder) -> None:
    fast = Encoder(default_model_dir(), dtype=torch.bfloat16)
    ours, exact = fast.encode(TEXTS).vectors, float32_encoder.encode(TEXTS).vectors

    assert fast.encode(TEXTS).vectors.dtype == np.float32
    assert np.min(np.sum(ours * exact, axis=1)) > 0.999


def test_bfloat16_keeps_the_similarities_that_decide_hits(float32_encoder: Encoder) -> None:
    # A hit is decided by similarity against a threshold and by rank among candidates:
    # reduced precision must leave both where float32 puts them.
    texts = [
        "How do I reset my router password?",
        "What is the way to reset the password of my router?",
        "Why can't I reset my router password?",
        "How do I reset my modem password?",
        "Best pizza in Naples",
    ]
    exact = float32_encoder.encode(texts).vectors
    fast = Encoder(default_model_dir(), dtype=torch.bfloat16).encode(texts).vectors
    exact_sims, fast_sims = exact[1:] @ exact[0], fast[1:] @ fast[0]

    np.testing.assert_allclose(fast_sims, exact_sims, atol=2e-3)
    assert list(np.argsort(fast_sims)) == list(np.argsort(exact_sims))


def test_nothing_to_encode(encoder: Encoder) -> None:
    assert encoder.encode([]).vectors.shape == (0, 384)


def test_a_directory_without_a_model_is_refused(tmp_path) -> None:
    with pytest.raises(EncoderLoadError, match=r"tokenizer\.json"):
        Encoder(tmp_path)
