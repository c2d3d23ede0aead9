"""The in-process vector index: exact search, removal, bounds and the sign-bit prefilter."""

from __future__ import annotations

import numpy as np
import pytest

from llm_cache.guard import extract
from llm_cache.index import VectorIndex

FEATURES = extract("a prompt")
DIM = 32


def unit(rng: np.random.Generator, n: int, dim: int = DIM) -> np.ndarray:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def index(**kw: int) -> VectorIndex:
    options = {"max_vectors": 1000, "prefilter_min_rows": 10_000, "prefilter_keep": 64} | kw
    return VectorIndex(DIM, **options)


def test_search_returns_the_nearest_above_the_threshold_best_first() -> None:
    rng = np.random.default_rng(0)
    vectors = unit(rng, 50)
    idx = index()
    for i, v in enumerate(vectors):
        idx.put("ns", f"e{i}", v, FEATURES)

    found = idx.search("ns", vectors[7], k=3, min_similarity=-1.0)

    assert next(c.entry_id for c in found) == "e7"
    assert found[0].similarity == pytest.approx(1.0, abs=1e-5)
    assert [c.similarity for c in found] == sorted((c.similarity for c in found), reverse=True)
    assert idx.search("ns", vectors[7], k=3, min_similarity=0.99)[0].entry_id == "e7"
    assert len(idx.search("ns", vectors[7], k=3, min_similarity=0.99)) == 1


def test_namespaces_are_separate() -> None:
    v = unit(np.random.default_rng(1), 1)[0]
    idx = index()
    idx.put("a", "e1", v, FEATURES)
    assert idx.search("b", v, k=1, min_similarity=0.0) == []


def test_remove_keeps_the_other_rows_findable() -> None:
    rng = np.random.default_rng(2)
    vectors = unit(rng, 20)
    idx = index()
    for i, v in enumerate(vectors):
        idx.put("ns", f"e{i}", v, FEATURES)

    assert idx.remove("e3")
    assert not idx.remove("e3")
    assert "e3" not in idx
    for i in (0, 19, 5):
        assert idx.search("ns", vectors[i], k=1, min_similarity=0.99)[0].entry_id == f"e{i}"
    assert len(idx) == 19


def test_put_replaces_and_moves_between_namespaces() -> None:
    rng = np.random.default_rng(3)
    a, b = unit(rng, 2)
    idx = index()
    idx.put("x", "e", a, FEATURES)
    idx.put("y", "e", b, FEATURES)
    assert len(idx) == 1
    assert idx.search("x", a, k=1, min_similarity=0.0) == []
    assert idx.search("y", b, k=1, min_similarity=0.99)[0].entry_id == "e"


def test_the_index_is_bounded() -> None:
    vectors = unit(np.random.default_rng(4), 3)
    idx = index(max_vectors=2)
    assert idx.put("ns", "e0", vectors[0], FEATURES)
    assert idx.put("ns", "e1", vectors[1], FEATURES)
    assert not idx.put("ns", "e2", vectors[2], FEATURES)
    assert idx.put("ns", "e1", vectors[2], FEATURES)  # replacing is not growing


def test_the_prefilter_finds_near_duplicates_like_exact_search() -> None:
    rng = np.random.default_rng(5)
    base = unit(rng, 3000, dim=384)
    exact = VectorIndex(384, max_vectors=10_000, prefilter_min_rows=100_000, prefilter_keep=128)
    filtered = VectorIndex(384, max_vectors=10_000, prefilter_min_rows=100, prefilter_keep=128)
    for i, v in enumerate(base):
        exact.put("ns", f"e{i}", v, FEATURES)
        filtered.put("ns", f"e{i}", v, FEATURES)
    noise = unit(rng, 200, dim=384)
    queries = base[:200] + 0.6 * noise  # cosine about 0.85 to their source
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)

    for q in queries:
        want = exact.search("ns", q, k=1, min_similarity=0.5)
        got = filtered.search("ns", q, k=1, min_similarity=0.5)
        assert [c.entry_id for c in got] == [c.entry_id for c in want]
