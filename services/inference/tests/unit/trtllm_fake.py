"""Helpers for the TensorRT-LLM adapter tests: install the stand-in `tensorrt_llm` package
(tests/fakes) and write toy checkpoints it can load."""

from __future__ import annotations

import importlib
import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from llm_inference.backends.trtllm import TrtLlmConfig

FAKE = Path(__file__).resolve().parents[1] / "fakes" / "tensorrt_llm"
VOCAB = 64
EOS = 1
TOY_PEAK = 5.0  # the stand-in's logit for its greedy token (0 for every other token)


def install_fake_tensorrt_llm(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The stand-in as the `tensorrt_llm` package (with `.llmapi` imported)."""
    remove_fake_tensorrt_llm()
    spec = importlib.util.spec_from_file_location(
        "tensorrt_llm", FAKE / "__init__.py", submodule_search_locations=[str(FAKE)]
    )
    assert spec is not None
    assert spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "tensorrt_llm", package)
    spec.loader.exec_module(package)
    importlib.import_module("tensorrt_llm.llmapi")
    return package


def remove_fake_tensorrt_llm() -> None:
    for name in [n for n in sys.modules if n == "tensorrt_llm" or n.startswith("tensorrt_llm.")]:
        sys.modules.pop(name, None)


def write_checkpoint(directory: Path) -> Path:
    """config.json + a word-level tokenizer.json: token i decodes to `w<i>`."""
    vocab = {f"w{i}": i for i in range(VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"vocab_size": VOCAB, "eos_token_id": EOS, "max_position_embeddings": 128}
    (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


def trtllm_config(checkpoint: Path, **overrides: object) -> TrtLlmConfig:
    values: dict[str, object] = {
        "checkpoint": checkpoint, "model_name": "toy", "max_context": 128,
        "tensor_parallel_size": 2, "pipeline_parallel_size": 2, "max_num_seqs": 8,
        "max_batched_tokens": 256, "gpu_memory_fraction": 0.5, "stats_interval_s": 0.01,
    }  # fmt: skip
    values.update(overrides)
    return TrtLlmConfig(**values)  # type: ignore[arg-type]


def toy_greedy(prompt: list[int], n: int) -> list[int]:
    """What the stand-in model generates greedily (ignoring EOS, without a bias)."""
    history = list(prompt)
    for _ in range(n):
        history.append((7 * history[-1] + 3 * len(history)) % VOCAB)
    return history[len(prompt) :]


def toy_logprobs(bias: dict[int, float] | None = None, greedy: int = 0) -> tuple[float, float]:
    """(logprob of the greedy token, of any other unbiased token) under the stand-in's logits."""
    logits = [0.0] * VOCAB
    logits[greedy] = TOY_PEAK
    for token_id, value in (bias or {}).items():
        logits[token_id] += value
    norm = math.log(sum(math.exp(x) for x in logits))
    other = next(t for t in range(VOCAB) if t != greedy and t not in (bias or {}))
    return logits[greedy] - norm, logits[other] - norm
