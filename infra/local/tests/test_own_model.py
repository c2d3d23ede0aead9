"""`make up MODEL=...`: checkpoint validation, the run's catalogue and prices, refusals."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import save_file

from llm_common.models_config import load_catalog
from llm_stack.byo import OwnModel, model_name, with_own_model
from llm_stack.checkpoint import UnservableCheckpointError, validate
from llm_stack.config import StackConfig

REPO = Path(__file__).resolve().parents[3]
VOCAB, HIDDEN, LAYERS = 64, 16, 2


def write_checkpoint(path: Path, model_type: str = "llama", **config: object) -> Path:
    """A structurally complete HF checkpoint (tiny, random); enough for validation."""
    path.mkdir(parents=True, exist_ok=True)
    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}.get(model_type, "X")
    hf = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": 32,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "hidden_act": "silu",
        "max_position_embeddings": 512,
        "dtype": "float32",
        **config,
    }
    (path / "config.json").write_text(json.dumps(hf))
    tensors = {"model.embed_tokens.weight": torch.zeros(VOCAB, HIDDEN)}
    for i in range(LAYERS):
        tensors[f"model.layers.{i}.mlp.up_proj.weight"] = torch.zeros(32, HIDDEN)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "BPE"}}))
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": template}))
    return path


def test_a_complete_checkpoint_is_accepted(tmp_path: Path) -> None:
    facts = validate(write_checkpoint(tmp_path / "m"), replicas=2)
    assert facts.model_type == "llama"
    assert facts.parameters == VOCAB * HIDDEN + LAYERS * 32 * HIDDEN
    assert facts.context_length == 512


def test_qwen2_and_bfloat16_are_accepted(tmp_path: Path) -> None:
    facts = validate(write_checkpoint(tmp_path / "q", "qwen2", dtype="bfloat16"), replicas=1)
    assert (facts.model_type, facts.dtype) == ("qwen2", "bfloat16")


def _reason(path: Path, replicas: int = 1, available: int | None = None) -> str:
    with pytest.raises(UnservableCheckpointError) as caught:
        validate(path, replicas, available)
    line = str(caught.value)
    assert "\n" not in line
    return line


def test_missing_tokenizer_is_refused(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "m")
    (path / "tokenizer.json").unlink()
    assert _reason(path) == "no tokenizer.json (a fast tokenizer is required)"


def test_missing_chat_template_is_refused(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "m")
    (path / "tokenizer_config.json").write_text("{}")
    assert "no chat template" in _reason(path)


def test_unsupported_architecture_is_refused(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "m", "gpt2", architectures=["GPT2LMHeadModel"])
    assert _reason(path).startswith("architecture GPT2LMHeadModel is not supported (supported:")


def test_unsupported_dtype_is_refused(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "m", dtype="float8_e4m3fn")
    assert _reason(path).startswith("dtype float8_e4m3fn is not supported")


def test_truncated_safetensors_is_refused(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "m")
    weights = path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    assert _reason(path).startswith("model.safetensors is corrupt")


def test_garbage_safetensors_is_refused(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "m")
    (path / "model.safetensors").write_bytes(b"\xff" * 64)
    assert _reason(path).startswith("model.safetensors is corrupt")


def test_hash_mismatch_is_refused(tmp_path: Path) -> None:
    """Same size, one flipped byte in a tensor: only the recorded SHA-256 can tell."""
    path = write_checkpoint(tmp_path / "m")
    weights = path / "model.safetensors"
    data = bytearray(weights.read_bytes())
    (path / "SHA256SUMS").write_text(f"{hashlib.sha256(data).hexdigest()}  model.safetensors\n")
    validate(path, 1)  # intact: accepted
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert _reason(path).startswith("model.safetensors is corrupt: its SHA-256 does not match")


def test_no_weights_is_refused(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "m")
    (path / "model.safetensors").unlink()
    assert _reason(path).startswith("no *.safetensors weights")


def test_a_model_too_big_for_memory_is_refused(tmp_path: Path) -> None:
    reason = _reason(write_checkpoint(tmp_path / "m"), replicas=2, available=2**20)
    assert "GiB is available" in reason
    assert "MODEL_REPLICAS=1" in reason


def test_not_a_directory_is_refused(tmp_path: Path) -> None:
    assert _reason(tmp_path / "absent") == "not a directory"


def test_the_run_gets_its_own_catalogue_and_price(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "ckpt")
    config = StackConfig.from_env(REPO, {"LLM_RUN_DIR": str(tmp_path / "run")})
    updated, _ = with_own_model(config, OwnModel(path, model_name(path, "mine"), replicas=2))
    catalog = load_catalog(updated.models_config, updated.model_root)
    spec = catalog.resolve("demo")
    assert spec is not None
    assert spec.name == "mine"
    assert spec.checkpoint == path.resolve()
    assert spec.deployments[0].replicas == ("127.0.0.1:50054", "127.0.0.1:50064")
    assert catalog.resolve("all-minilm-l6-v2") is not None
    assert catalog.resolve("demo-llama") is None
    prices = yaml.safe_load(updated.prices_config.read_text())["prices"]
    assert any(p["model"] == "mine" for p in prices)
    # infra/config is untouched
    assert "mine" not in (REPO / "infra/config/models.yaml").read_text()


def test_free_ports_follow_the_new_catalogue(tmp_path: Path) -> None:
    path = write_checkpoint(tmp_path / "ckpt")
    env = {"LLM_RUN_DIR": str(tmp_path / "run"), "LLM_PORTS": "free"}
    config = StackConfig.from_env(REPO, env)
    updated, _ = with_own_model(config, OwnModel(path, "mine", replicas=3))
    assert len(updated.ports.replicas) == 4  # three replicas and the encoder


def test_a_bad_name_is_refused(tmp_path: Path) -> None:
    from llm_common.config import ConfigError

    with pytest.raises(ConfigError):
        model_name(tmp_path, "has space")


@pytest.mark.parametrize("broken", ["tokenizer", "architecture"])
def test_up_refuses_with_one_line(tmp_path: Path, broken: str) -> None:
    path = write_checkpoint(tmp_path / "m")
    if broken == "tokenizer":
        (path / "tokenizer.json").unlink()
    else:
        config = json.loads((path / "config.json").read_text())
        (path / "config.json").write_text(json.dumps({**config, "model_type": "gpt2"}))
    env = {**os.environ, "LLM_RUN_DIR": str(tmp_path / "run"), "LLM_PORTS": "free"}
    done = subprocess.run(
        [sys.executable, "-m", "llm_stack", "up", "--model", str(path)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"llm-stack: cannot serve {path}: ")
    assert not (tmp_path / "run" / "logs").exists()  # nothing was started
