"""Tests for build_demo_model.py: files, determinism, HF loading, non-degenerate output."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from tokenizers import Tokenizer

UNICODE_TEXT = (
    "Héllo wörld — naïve café, Zürich! 你好，世界。こんにちは 안녕하세요 Привет "
    "👩‍💻🇫🇷😀🚀 and code:\n    def f(x):  return x ** 2  # ok .  \n\n"
)
PROMPTS = ("The weather today", "def main():", "你好，世界", "User: What is a cache?")


def _load_builder() -> ModuleType:
    # Not a package: load by path (the root config uses --import-mode=importlib).
    path = Path(__file__).resolve().parent / "build_demo_model.py"
    spec = importlib.util.spec_from_file_location("build_demo_model", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while decorating
    spec.loader.exec_module(module)
    return module


bdm = _load_builder()


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out: Path = bdm.build(tmp_path_factory.mktemp("seed0") / "demo-model", seed=0)
    return out


@pytest.fixture(scope="module")
def hf(ckpt: Path) -> Iterator[tuple[Any, Any]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(ckpt, local_files_only=True)
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            ckpt, local_files_only=True, output_loading_info=True
        )
        model, info = loaded
        assert not info["missing_keys"]
        assert not info["unexpected_keys"]
        yield tok, model.eval()


def _read_json(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return data


def test_files_present_and_readable(ckpt: Path) -> None:
    for name in bdm.OUTPUT_FILES:
        assert (ckpt / name).is_file(), name
        assert (ckpt / name).stat().st_mode & 0o044 == 0o044, f"{name} not world-readable"
    info = _read_json(ckpt / "build_info.json")
    assert info["seed"] == 0
    assert info["version"] == bdm.BUILD_VERSION
    # No temp or moved-aside directories left next to the output.
    assert [p.name for p in ckpt.parent.iterdir()] == [ckpt.name]


def test_config_shape(ckpt: Path) -> None:
    cfg = _read_json(ckpt / "config.json")
    assert cfg["model_type"] == "llama"
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["num_attention_heads"] > cfg["num_key_value_heads"]  # GQA
    assert not cfg["tie_word_embeddings"]
    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    assert cfg["vocab_size"] == tok.get_vocab_size() == 4096
    assert cfg["bos_token_id"] == tok.token_to_id("<|bos|>")
    assert cfg["eos_token_id"] == tok.token_to_id("<|eos|>")


def test_second_build_is_skipped_and_force_rebuilds(ckpt: Path) -> None:
    before = (ckpt / "model.safetensors").stat().st_mtime_ns
    bdm.build(ckpt, seed=0)
    assert (ckpt / "model.safetensors").stat().st_mtime_ns == before
    bdm.build(ckpt, seed=0, force=True)
    assert (ckpt / "build_info.json").is_file()
    assert [p.name for p in ckpt.parent.iterdir()] == [ckpt.name]


def test_refuses_to_replace_foreign_directory(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError):
        bdm.build(tmp_path, seed=0)
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_deterministic_per_seed(ckpt: Path, tmp_path: Path) -> None:
    same = bdm.build(tmp_path / "same", seed=0)
    other = bdm.build(tmp_path / "other", seed=1)
    weights = (ckpt / "model.safetensors").read_bytes()
    assert (same / "model.safetensors").read_bytes() == weights
    assert (other / "model.safetensors").read_bytes() != weights
    # The tokenizer does not depend on the seed.
    for d in (same, other):
        assert (d / "tokenizer.json").read_bytes() == (ckpt / "tokenizer.json").read_bytes()


def test_tokenizer_round_trip(ckpt: Path, hf: tuple[Any, Any]) -> None:
    raw = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    enc = raw.encode(UNICODE_TEXT)
    assert enc.ids[0] == raw.token_to_id("<|bos|>")
    assert raw.decode(enc.ids) == UNICODE_TEXT
    tok, _ = hf
    ids = tok(UNICODE_TEXT)["input_ids"]
    assert ids == enc.ids
    assert tok.decode(ids, skip_special_tokens=True) == UNICODE_TEXT
    assert tok.decode(tok(UNICODE_TEXT, add_special_tokens=False)["input_ids"]) == UNICODE_TEXT


def test_special_tokens(hf: tuple[Any, Any]) -> None:
    tok, _ = hf
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|bos|>", "<|eos|>", "<|pad|>")
    for marker in bdm.CHAT_MARKERS:
        assert len(tok(marker, add_special_tokens=False)["input_ids"]) == 1


def test_chat_template(hf: tuple[Any, Any]) -> None:
    tok, _ = hf
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi 👋"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "你好"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|bos|><|system|>\nBe brief.<|eos|>\n<|user|>\nHi 👋<|eos|>\n"
        "<|assistant|>\nHello!<|eos|>\n<|user|>\n你好<|eos|>\n<|assistant|>\n"
    )
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert ids == tok(text, add_special_tokens=False)["input_ids"]
    assert ids.count(tok.bos_token_id) == 1
    with pytest.raises(Exception, match="Unsupported role"):
        tok.apply_chat_template([{"role": "function", "content": "x"}], tokenize=False)
    with pytest.raises(Exception, match="must answer a call"):
        tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


def test_chat_template_renders_tools_calls_and_results(hf: tuple[Any, Any]) -> None:
    tok, _ = hf
    tools = [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]
    call = {"type": "function", "function": {"name": "w", "arguments": {"city": "Paris"}}}
    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    text = tok.apply_chat_template(messages, tools=tools, tokenize=False)
    assert text.startswith("<|bos|><|system|>\n# Tools\n")
    assert '\n{"type": "function", "function": {"name": "w"' in text
    assert '<|assistant|>\n<tool_call>\n{"name": "w", "arguments": {"city": "Paris"}}\n' in text
    assert text.endswith("<|user|>\n<tool_response>\nsunny\n</tool_response><|eos|>\n")


def test_greedy_generation_is_not_degenerate(hf: tuple[Any, Any]) -> None:
    import torch

    tok, model = hf
    special = set(range(len(bdm.SPECIAL_TOKENS)))
    outputs = []
    for prompt in PROMPTS:
        enc = tok(prompt, return_tensors="pt")
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=32, min_new_tokens=32, do_sample=False)
        new = out[0, enc["input_ids"].shape[1] :].tolist()
        assert len(new) == 32
        assert len(set(new)) > 4, (prompt, new)
        assert not (set(new) & special - {tok.eos_token_id}), "silenced special token emitted"
        outputs.append(tuple(new))
    assert len(set(outputs)) == len(PROMPTS)


def test_cli_up_to_date(ckpt: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO"):
        assert bdm.main(["--out", os.fspath(ckpt)]) == 0
    assert "up to date" in caplog.text
