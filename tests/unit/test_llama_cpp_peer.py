"""bench-engine's llama.cpp peer (bench/engine_llama_cpp*.py, docs/adr/0016): which tokenizers the
GGUF conversion maps to llama.cpp's gpt-2 pre-tokenizer, and - where `make llama-cpp` has run -
the real conversion of the demo checkpoint and the batched greedy runner."""

from __future__ import annotations

import copy
import json
import os
import random
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / ".cache" / "models" / "demo-llama"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    return REPO / "bench"


def _tokenizer(tmp_path: Path, change: dict[str, Any] | None = None) -> Path:
    spec = json.loads((DEMO / "tokenizer.json").read_text("utf-8"))
    spec = copy.deepcopy(spec) | (change or {})
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec), "utf-8")
    return tmp_path


def _convert_module(bench: Path) -> ModuleType:
    import engine_llama_cpp_convert

    return engine_llama_cpp_convert


def test_only_gpt2_byte_level_tokenizers_count_as_gpt2(bench: Path, tmp_path: Path) -> None:
    convert = _convert_module(bench)
    assert convert.is_gpt2_byte_level(DEMO)
    byte_level = json.loads((DEMO / "tokenizer.json").read_text("utf-8"))["pre_tokenizer"]
    variants: list[dict[str, Any]] = [
        {"pre_tokenizer": byte_level | {"add_prefix_space": True}},
        {"pre_tokenizer": byte_level | {"use_regex": False}},
        {"pre_tokenizer": {"type": "Metaspace", "replacement": "▁"}},
        {"normalizer": {"type": "NFKC"}},
    ]
    for i, change in enumerate(variants):
        directory = tmp_path / str(i)
        directory.mkdir()
        assert not convert.is_gpt2_byte_level(_tokenizer(directory, change)), change
    assert not convert.is_gpt2_byte_level(tmp_path / "missing")


def _llama_cpp_ready() -> tuple[ModuleType, Path]:
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python: `make llama-cpp`")
    import engine_llama_cpp_gguf

    source = engine_llama_cpp_gguf.converter_dir(llama_cpp.__version__)
    if not (source / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"no converter at {source}: `make llama-cpp`")
    return llama_cpp, source


@pytest.mark.slow
def test_demo_converts_and_llama_cpp_tokenizes_like_us(bench: Path) -> None:
    llama_cpp, _ = _llama_cpp_ready()
    import engine_llama_cpp_gguf as gguf

    path = gguf.gguf_for(DEMO, llama_cpp.__version__, "f32")
    assert path.stat().st_size > 19_000_000  # 5M float32 parameters
    assert gguf.tokenizer_agreement(path, DEMO) == {"tokens": 114, "identical": True}


@pytest.mark.slow
def test_batched_greedy_matches_one_sequence_at_a_time(bench: Path) -> None:
    llama_cpp, _ = _llama_cpp_ready()
    import engine_llama_cpp_gguf as gguf
    from engine_llama_cpp_runner import LlamaCppConfig, LlamaCppRunner

    path = gguf.gguf_for(DEMO, llama_cpp.__version__, "f32")
    rng = random.Random(3)
    prompts = [[rng.randrange(6, 4096) for _ in range(24 + 8 * i)] for i in range(3)]
    threads = min(2, os.cpu_count() or 1)
    runner = LlamaCppRunner(LlamaCppConfig(path, threads, n_seq=3, n_ctx_per_seq=256))
    try:
        together = runner.generate(prompts, 12)
        alone = [runner.generate([p], 12).outputs[0] for p in prompts]
        again = runner.generate(prompts, 12)  # the KV cache is cleared between calls
    finally:
        runner.close()
    assert [len(o) for o in together.outputs] == [12, 12, 12]
    assert together.outputs == alone == again.outputs
    assert together.seconds >= together.decode_seconds > 0
