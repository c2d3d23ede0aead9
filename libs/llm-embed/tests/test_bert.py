"""The BERT encoder's checkpoint loading: Hugging Face names as is, unknown tensors refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from llm_embed import BertConfig, BertEncoder, ModelLoadError, load_bert
from llm_embed.bert import checkpoint_state

TINY = {
    "model_type": "bert",
    "vocab_size": 50,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 32,
    "max_position_embeddings": 64,
}


def _write_checkpoint(directory: Path, extra: dict[str, torch.Tensor] | None = None) -> Path:
    torch.manual_seed(0)
    model = BertEncoder(BertConfig.from_dict(TINY))
    tensors = {f"bert.{k}": v.contiguous() for k, v in model.state_dict().items()}
    tensors["bert.pooler.dense.weight"] = torch.zeros(16, 16)  # not used, skipped
    tensors.update(extra or {})
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(TINY), encoding="utf-8")
    return directory


def test_a_prefixed_checkpoint_loads_with_its_weights(tmp_path: Path) -> None:
    model = load_bert(_write_checkpoint(tmp_path))
    torch.manual_seed(0)
    expected = BertEncoder(BertConfig.from_dict(TINY))
    ids = torch.tensor([[1, 7, 9, 2, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])
    with torch.inference_mode():
        torch.testing.assert_close(model(ids, mask), expected.eval()(ids, mask))


def test_checkpoint_state_strips_the_prefix_and_skips_unused_tensors() -> None:
    weight = torch.zeros(1)
    state = checkpoint_state(
        {
            "bert.encoder.layer.3.attention.self.query.weight": weight,
            "pooler.dense.weight": weight,
            "embeddings.position_ids": weight,
            "cls.predictions.bias": weight,
        }
    )
    assert list(state) == ["encoder.layer.3.attention.self.query.weight"]


def test_unknown_tensors_are_refused(tmp_path: Path) -> None:
    _write_checkpoint(tmp_path, {"decoder.weight": torch.zeros(2)})
    with pytest.raises(ModelLoadError, match=r"unexpected tensor \['decoder.weight'\]"):
        load_bert(tmp_path)


def test_missing_weights_are_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY), encoding="utf-8")
    with pytest.raises(ModelLoadError, match=r"model\.safetensors"):
        load_bert(tmp_path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "roberta"}, "not bert"),
        ({"hidden_act": "relu"}, "gelu"),
        ({"position_embedding_type": "relative_key"}, "absolute"),
        ({"num_attention_heads": 5}, "multiple"),
        ({"vocab_size": None}, "invalid field"),
    ],
)
def test_unsupported_configs_are_refused(change: dict[str, object], message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        BertConfig.from_dict({**TINY, **change})
