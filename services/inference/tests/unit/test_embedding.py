"""The plain-torch BERT encoder against sentence-transformers on the bundled all-MiniLM-L6-v2."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from llm_common.config import ConfigError
from llm_inference.embedding.encoder import SentenceEncoder
from llm_inference.embedding.runtime import EmbeddingRuntime

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A",
    "Embeddings map sentences to vectors; similar meanings land close together. " * 12,
    "日本語のテキストと中文文本 mixed with English words.",
    "gRPC streams tokens from the inference replica to the router.",
]


@pytest.fixture(scope="module")
def encoder(minilm_dir: Path) -> SentenceEncoder:
    return SentenceEncoder.from_dir(minilm_dir, batch_size=2)


@pytest.fixture(scope="module")
def reference(minilm_dir: Path) -> np.ndarray:
    """sentence-transformers' own vectors (its pipeline ends in Normalize)."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(minilm_dir), device="cpu")
    vectors: np.ndarray = model.encode(TEXTS, convert_to_numpy=True)
    return vectors


def test_vectors_equal_sentence_transformers(
    encoder: SentenceEncoder, reference: np.ndarray
) -> None:
    result = encoder.encode(TEXTS, normalize=True)
    assert result.dimensions == 384
    np.testing.assert_allclose(np.array(result.vectors), reference, atol=1e-4, rtol=0)


def test_unnormalized_vectors_are_the_mean_pool(
    encoder: SentenceEncoder, reference: np.ndarray
) -> None:
    raw = np.array(encoder.encode(TEXTS, normalize=False).vectors)
    norms = np.linalg.norm(raw, axis=1, keepdims=True)
    assert not np.allclose(norms, 1.0)
    np.testing.assert_allclose(raw / norms, reference, atol=1e-4, rtol=0)


def test_batching_and_order_do_not_change_vectors(
    minilm_dir: Path, encoder: SentenceEncoder
) -> None:
    one_by_one = SentenceEncoder.from_dir(minilm_dir, batch_size=1)
    batched = np.array(encoder.encode(TEXTS).vectors)
    single = np.array(one_by_one.encode(TEXTS).vectors)
    np.testing.assert_allclose(batched, single, atol=1e-5, rtol=0)
    reversed_ = np.array(encoder.encode(TEXTS[::-1]).vectors)[::-1]
    np.testing.assert_allclose(reversed_, batched, atol=1e-5, rtol=0)


def test_long_texts_are_truncated_and_tokens_counted(encoder: SentenceEncoder) -> None:
    assert encoder.max_length == 256  # from sentence_bert_config.json
    result = encoder.encode(["word " * 1000, "hi"])
    assert result.prompt_tokens == 256 + 3  # [CLS] hi [SEP]


def test_a_checkpoint_it_cannot_load_is_a_config_error(tmp_path: Path) -> None:
    # Checkpoint details (unknown tensors, config fields) are tested in libs/llm-embed.
    with pytest.raises(ConfigError, match=r"tokenizer\.json"):
        SentenceEncoder.from_dir(tmp_path)


async def test_runtime_reports_load_and_info(encoder: SentenceEncoder) -> None:
    runtime = EmbeddingRuntime(encoder, "minilm")
    results = await asyncio.gather(*(runtime.embed(TEXTS[:2], normalize=True) for _ in range(3)))
    assert all(len(r.vectors) == 2 for r in results)
    load = runtime.load()
    assert (load.num_waiting, load.num_running) == (0, 0)
    assert load.tokens_per_second > 0
    info = runtime.info()
    assert (info.model, info.dtype, info.device, info.max_context) == (
        "minilm", "float32", "cpu", 256,
    )  # fmt: skip
