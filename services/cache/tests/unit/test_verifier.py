"""The learned verifier: the shipped model's decisions, its inputs, loading errors, modes in
the settings, and the engine scoring only candidates above the threshold."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import torch

from llm_cache.config import SemanticSettings, Settings
from llm_cache.encoder import Encoder, default_model_dir
from llm_cache.index import VectorIndex
from llm_cache.semantic import IndexItem, SemanticEngine
from llm_cache.verifier import Verifier, VerifierLoadError, default_verifier_dir
from llm_common.config import ConfigError


@pytest.fixture(scope="module")
def verifier() -> Verifier:
    return Verifier(default_verifier_dir(), default_model_dir())


def probability(verifier: Verifier, stored: str, query: str) -> float:
    a, b = verifier.tokens([stored, query])
    return float(verifier.score([(a, b)])[0])


@pytest.mark.parametrize(
    ("stored", "query"),
    [
        ("Write a haiku about the ocean.", "Could you write me a haiku about the ocean?"),
        ("Give me a list of healthy breakfast ideas.", "What are some healthy breakfast ideas?"),
        (
            "How do I learn to swim as an adult?",
            "What's the best way to learn to swim as an adult?",
        ),
    ],
)  # training-split wording: the model must have learnt these
def test_the_shipped_model_accepts_paraphrases(verifier: Verifier, stored: str, query: str) -> None:
    assert probability(verifier, stored, query) >= verifier.point("balanced").probability


@pytest.mark.parametrize(
    ("stored", "query"),
    [
        ("Is a horse faster than a zebra?", "Is a zebra faster than a horse?"),
        ("Explain the plot of Macbeth as a table.", "Explain the plot of Macbeth as a poem."),
        ("How do I create a playlist?", "How do I delete a playlist?"),
    ],
)
def test_the_shipped_model_rejects_near_misses(verifier: Verifier, stored: str, query: str) -> None:
    assert probability(verifier, stored, query) < verifier.point("balanced").probability


def test_strict_is_at_least_as_demanding_as_balanced(verifier: Verifier) -> None:
    strict, balanced = verifier.point("strict"), verifier.point("balanced")
    assert strict.probability >= balanced.probability
    assert strict.similarity_margin >= balanced.similarity_margin


def test_pairs_are_cls_a_sep_b_sep_with_token_types(verifier: Verifier) -> None:
    a, b = verifier.tokens(["short one", "a somewhat longer second prompt"])
    ids, types, mask = verifier.tokenizer.batch([(a, b), (a, a)])

    n = len(a) + len(b) + 3
    assert ids.shape == (2, n)
    assert types[0].tolist() == [0] * (len(a) + 2) + [1] * (len(b) + 1)
    assert mask[1].sum() == 2 * len(a) + 3  # the shorter row is padded
    assert ids[1, 2 * len(a) + 3 :].eq(0).all()


def test_prompts_are_cut_to_side_tokens(verifier: Verifier) -> None:
    [tokens] = verifier.tokens(["word " * 500])
    assert len(tokens) == verifier.spec.side_tokens


def test_packed_tokens_score_like_tokens(verifier: Verifier) -> None:
    texts = ["Is tea healthier than coffee?", "Is coffee healthier than tea?"]
    packed, plain = verifier.token_bytes(texts), verifier.tokens(texts)

    np.testing.assert_allclose(
        verifier.score_bytes([(packed[0], packed[1])]), verifier.score([(plain[0], plain[1])])
    )
    assert verifier.score([]).shape == (0,)


def test_another_encoder_checkpoint_is_refused(tmp_path: Path) -> None:
    encoder_dir = tmp_path / "encoder"
    shutil.copytree(default_model_dir(), encoder_dir)
    with (encoder_dir / "model.safetensors").open("ab") as f:
        f.write(b"\0")  # any other weights: the verifier's layers expect these embeddings

    with pytest.raises(VerifierLoadError, match="other encoder weights"):
        Verifier(default_verifier_dir(), encoder_dir)


def test_a_bad_model_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(VerifierLoadError, match="config"):
        Verifier(tmp_path, default_model_dir())
    config = json.loads((default_verifier_dir() / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(VerifierLoadError, match=r"model\.safetensors"):
        Verifier(tmp_path, default_model_dir())


def test_modes_from_the_environment() -> None:
    semantic = Settings.from_env(
        {
            "CACHE_SEMANTIC_VERIFIER": "strict",
            "CACHE_SEMANTIC_VERIFIER_TENANTS": "acme=off, bank=strict,shop=balanced",
        }
    ).semantic

    assert semantic.verifier_mode("acme") == "off"
    assert semantic.verifier_mode("shop") == "balanced"
    assert semantic.verifier_mode("anyone") == "strict"
    assert semantic.verifier_needed
    assert semantic.verifier_candidates == SemanticSettings().verifier_candidates
    assert (
        Settings.from_env({"CACHE_SEMANTIC_VERIFIER_CANDIDATES": "3"}).semantic.verifier_candidates
        == 3
    )
    assert SemanticSettings().verifier == "off"
    assert not SemanticSettings().verifier_needed
    assert SemanticSettings(verifier_tenants=(("acme", "balanced"),)).verifier_needed


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"CACHE_SEMANTIC_VERIFIER": "lenient"}, "CACHE_SEMANTIC_VERIFIER"),
        ({"CACHE_SEMANTIC_VERIFIER_TENANTS": "acme"}, "CACHE_SEMANTIC_VERIFIER_TENANTS"),
        ({"CACHE_SEMANTIC_VERIFIER_TENANTS": "acme=loose"}, "CACHE_SEMANTIC_VERIFIER_TENANTS"),
        ({"CACHE_SEMANTIC_VERIFIER_CANDIDATES": "0"}, "CACHE_SEMANTIC_VERIFIER_CANDIDATES"),
    ],
)
def test_bad_modes_name_the_variable(environ: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError, match=variable):
        Settings.from_env(environ)


@pytest.fixture
async def engine(encoder: Encoder, verifier: Verifier) -> AsyncIterator[SemanticEngine]:
    index = VectorIndex(encoder.dim, max_vectors=100, prefilter_min_rows=10_000, prefilter_keep=64)
    engine = SemanticEngine(encoder, index, max_batch=4, verifier=verifier)
    engine.start()
    try:
        yield engine
    finally:
        await engine.close()


async def test_the_engine_scores_only_candidates_above_the_threshold(
    engine: SemanticEngine, verifier: Verifier
) -> None:
    stored = ["Is tea healthier than coffee?", "How do I repot an orchid?"]
    for i, text in enumerate(stored):
        vector = (await engine.embed(text)).vector
        assert vector is not None
        await engine.put([IndexItem("ns", f"e{i}", vector, text)])

    search = await engine.search("ns", "Is coffee healthier than tea?", 8, 0.8)

    assert search is not None
    assert [c.entry_id for c in search.candidates] == ["e0"]  # the orchid is below 0.8
    [candidate] = search.candidates
    assert candidate.verified == pytest.approx(
        probability(verifier, stored[0], "Is coffee healthier than tea?"), abs=1e-3
    )
    assert candidate.verified < verifier.point("balanced").probability


async def test_without_a_verifier_candidates_are_unscored(encoder: Encoder) -> None:
    index = VectorIndex(encoder.dim, max_vectors=10, prefilter_min_rows=10_000, prefilter_keep=64)
    engine = SemanticEngine(encoder, index, max_batch=4)
    engine.start()
    try:
        vector = (await engine.embed("How do I repot an orchid?")).vector
        assert vector is not None
        await engine.put([IndexItem("ns", "e0", vector, "How do I repot an orchid?")])
        search = await engine.search("ns", "How should I repot an orchid?", 8, 0.5)
    finally:
        await engine.close()

    assert search is not None
    assert [c.verified for c in search.candidates] == [None]
    assert search.embedding.tokens == b""


def test_int8_and_float32_agree(verifier: Verifier, tmp_path: Path) -> None:
    assert verifier.spec.quantize == "int8"  # as shipped: the operating points assume it
    shutil.copytree(default_verifier_dir(), tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"quantize": "none"}))
    full = Verifier(tmp_path, default_model_dir(), dtype=torch.float32)
    texts = ["Is tea healthier than coffee?", "Is coffee healthier than tea?", "Tea or coffee?"]
    tokens = verifier.tokens(texts)
    pairs = [(tokens[0], tokens[1]), (tokens[0], tokens[2]), (tokens[1], tokens[2])]

    np.testing.assert_allclose(full.score(pairs), verifier.score(pairs), atol=0.1)


async def test_the_engine_scores_only_the_nearest_few(
    engine: SemanticEngine, verifier: Verifier
) -> None:
    stored = ["How do I repot an orchid?", "How should I repot an orchid?"]
    for i, text in enumerate(stored):
        vector = (await engine.embed(text)).vector
        assert vector is not None
        await engine.put([IndexItem("ns", f"e{i}", vector, text)])

    search = await engine.search("ns", "How can I repot an orchid?", 8, 0.5, verify=1)
    none = await engine.search("ns", "How can I repot an orchid?", 8, 0.5, verify=0)

    assert search is not None
    assert none is not None
    assert len(search.candidates) == 2
    assert search.candidates[0].verified is not None  # the nearest one only
    assert search.candidates[1].verified is None
    assert [c.verified for c in none.candidates] == [None, None]
