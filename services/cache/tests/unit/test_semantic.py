"""The semantic engine: batched embedding and index access in its worker thread."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import numpy as np
import pytest

from llm_cache.encoder import Encoder
from llm_cache.index import VectorIndex
from llm_cache.semantic import IndexItem, SemanticEngine

TEXTS = [f"Question {i}: how do I cook {food}?" for i, food in enumerate(
    ["rice", "pasta", "eggs", "beans", "fish", "bread", "soup", "tofu"]
)]  # fmt: skip


@pytest.fixture
async def engine(encoder: Encoder) -> AsyncIterator[SemanticEngine]:
    index = VectorIndex(encoder.dim, max_vectors=100, prefilter_min_rows=10_000, prefilter_keep=64)
    engine = SemanticEngine(encoder, index, max_batch=4)
    engine.start()
    try:
        yield engine
    finally:
        await engine.close()


async def test_concurrent_requests_are_batched_without_changing_results(
    engine: SemanticEngine, encoder: Encoder
) -> None:
    embeddings = await asyncio.gather(*(engine.embed(t) for t in TEXTS))

    expected = encoder.encode(TEXTS).vectors
    got = np.stack([e.vector for e in embeddings if e.vector is not None])
    np.testing.assert_allclose(got, expected, atol=1e-5)


async def test_search_finds_what_was_put(engine: SemanticEngine) -> None:
    vectors = [(await engine.embed(t)).vector for t in TEXTS]
    items = [
        IndexItem("ns", f"e{i}", v, t)
        for i, (v, t) in enumerate(zip(vectors, TEXTS, strict=True))
        if v is not None
    ]
    assert await engine.put(items) == len(TEXTS)

    found = await engine.search("ns", "Question 2: how do I cook eggs?", k=2, min_similarity=0.5)
    assert found is not None
    assert await engine.search("other", "Question 2", k=2, min_similarity=0.5) is None

    assert found.candidates[0].entry_id == "e2"
    assert found.embedding.features.numbers == ("2",)
    assert await engine.remove(["e2", "missing"]) == 1
    assert "e2" not in engine


async def test_texts_longer_than_the_encoder_window_get_no_vector(engine: SemanticEngine) -> None:
    embedding = await engine.embed("token " * 400)
    assert embedding.vector is None
