"""Tests for build_bench_model.py: shape, HF layout and loading, determinism, up-to-date skip."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch
from safetensors import safe_open

HERE = Path(__file__).resolve().parent


def _load(name: str) -> ModuleType:
    # Not a package: load by path (the root config uses --import-mode=importlib).
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bbm = _load("build_bench_model")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out: Path = bbm.build(tmp_path_factory.mktemp("bench") / "bench-llama", seed=0)
    return out


def test_shape_is_a_gqa_llama_of_about_120m_parameters(ckpt: Path) -> None:
    cfg = json.loads((ckpt / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["num_attention_heads"] == 4 * cfg["num_key_value_heads"]
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        params = sum(f.get_tensor(k).numel() for k in f.keys())  # noqa: SIM118 (not a dict)
    assert 100_000_000 <= params <= 150_000_000


def test_transformers_loads_it_and_greedy_output_varies(ckpt: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(ckpt)
    tok = AutoTokenizer.from_pretrained(ckpt)
    ids = tok("def main():", return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=16, do_sample=False)
    new = out[0, ids.shape[1] :].tolist()
    assert len(set(new)) > 4, new


def test_rebuild_is_skipped_and_bytes_are_deterministic(ckpt: Path, tmp_path: Path) -> None:
    stamp = (ckpt / "model.safetensors").stat().st_mtime_ns
    bbm.build(ckpt, seed=0)
    assert (ckpt / "model.safetensors").stat().st_mtime_ns == stamp
    again = bbm.build(tmp_path / "again", seed=0)
    assert (again / "tokenizer.json").read_bytes() == (ckpt / "tokenizer.json").read_bytes()
    assert (again / "model.safetensors").read_bytes() == (ckpt / "model.safetensors").read_bytes()
