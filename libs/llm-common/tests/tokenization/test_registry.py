"""Registry loading: every model at start-up, clear errors naming model and path."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from llm_common.models_config import ModelCatalog, ModelSpec, load_catalog
from llm_common.tokenization.chat_template import ChatMessage
from llm_common.tokenization.registry import ModelLoadError, SpecialToken, load_model, load_registry

# The tiny checkpoint of conftest.py: these special tokens get ids 0, 1, 2.
BOS, EOS, PAD = "<s>", "</s>", "<pad>"
WriteCheckpoint = Callable[..., Path]


def spec(checkpoint: Path, name: str = "tiny") -> ModelSpec:
    return ModelSpec(name=name, checkpoint=checkpoint, context_length=512)


def test_loads_every_model_and_resolves_aliases(tiny_catalog: ModelCatalog) -> None:
    registry = load_registry(tiny_catalog)
    assert registry.names() == ["plain", "tiny"]
    tiny = registry.get("tiny-alias")
    assert tiny is not None
    assert tiny.name == "tiny"
    assert registry.get("nope") is None


def test_model_facts(write_checkpoint: WriteCheckpoint, tiny_tokenizer: Tokenizer) -> None:
    model = load_model(spec(write_checkpoint()))
    assert model.vocab_size == tiny_tokenizer.get_vocab_size(with_added_tokens=True)
    assert model.max_context == 512
    assert model.bos == SpecialToken(BOS, 0)
    assert model.eos == SpecialToken(EOS, 1)
    assert model.pad == SpecialToken(PAD, 2)
    assert model.special_tokens == (
        SpecialToken(BOS, 0),
        SpecialToken(EOS, 1),
        SpecialToken(PAD, 2),
    )
    assert not model.chat_template.is_default


def test_batches_match_the_tokenizer(
    write_checkpoint: WriteCheckpoint, tiny_tokenizer: Tokenizer
) -> None:
    model = load_model(spec(write_checkpoint()))
    texts = ["Hello world", "", "中文 👍"]
    for add in (False, True):
        expected = [e.ids for e in tiny_tokenizer.encode_batch(texts, add_special_tokens=add)]
        assert model.encode_batch(texts, add_special_tokens=add) == expected
    ids = model.encode_batch(texts, add_special_tokens=True)
    assert model.decode_batch(ids, skip_special_tokens=True) == texts
    assert model.decode_batch(ids, skip_special_tokens=False)[0] == BOS + "Hello world"
    assert model.count_batch(texts) == [len(x) - 1 for x in ids]


def test_chat_template_tokens_have_one_bos(write_checkpoint: WriteCheckpoint) -> None:
    model = load_model(spec(write_checkpoint()))
    rendered = model.apply_chat_template([ChatMessage("user", "Hi")], add_generation_prompt=True)
    assert rendered.prompt == f"{BOS}[user]Hi{EOS}[assistant]"
    assert rendered.token_ids.count(0) == 1
    assert rendered.token_ids[0] == 0
    assert not rendered.default_template


def test_missing_template_selects_the_default(write_checkpoint: WriteCheckpoint) -> None:
    model = load_model(spec(write_checkpoint(template=None)))
    rendered = model.apply_chat_template([ChatMessage("user", "Hi")], add_generation_prompt=False)
    assert model.chat_template.is_default
    assert rendered.default_template
    assert rendered.prompt == "<|im_start|>user\nHi<|im_end|>\n"


def test_template_file_and_named_list_formats(write_checkpoint: WriteCheckpoint) -> None:
    listed = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    model = load_model(spec(write_checkpoint("listed", chat_template=listed)))
    assert model.chat_template.source == "D"
    directory = write_checkpoint("file")
    (directory / "chat_template.jinja").write_text("F", encoding="utf-8")
    assert load_model(spec(directory)).chat_template.source == "F"


def test_special_tokens_as_added_token_dicts(write_checkpoint: WriteCheckpoint) -> None:
    model = load_model(spec(write_checkpoint(bos_token={"content": BOS, "special": True})))
    assert model.bos == SpecialToken(BOS, 0)


def test_missing_tokenizer_json_names_model_and_path(write_checkpoint: WriteCheckpoint) -> None:
    directory = write_checkpoint()
    (directory / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="model tiny: tokenizer file not found") as info:
        load_model(spec(directory))
    assert str(directory / "tokenizer.json") in str(info.value)


def test_missing_checkpoint_directory(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=f"model ghost: .*{tmp_path / 'ghost'}"):
        load_model(spec(tmp_path / "ghost", name="ghost"))


def test_missing_tokenizer_config(write_checkpoint: WriteCheckpoint) -> None:
    directory = write_checkpoint()
    (directory / "tokenizer_config.json").unlink()
    with pytest.raises(ModelLoadError, match="tokenizer config not found"):
        load_model(spec(directory))


@pytest.mark.parametrize(
    ("file", "content", "message"),
    [
        ("tokenizer.json", "{not json", "cannot load"),
        ("tokenizer_config.json", "{not json", "cannot read"),
        ("tokenizer_config.json", "[1, 2]", "must hold a JSON object"),
        ("tokenizer_config.json", json.dumps({"chat_template": 5}), "is not a string"),
        ("tokenizer_config.json", json.dumps({"chat_template": "{% if %}"}), "does not compile"),
        ("tokenizer_config.json", json.dumps({"bos_token": "<nope>"}), "not in the vocabulary"),
    ],
)
def test_invalid_files(
    write_checkpoint: WriteCheckpoint, file: str, content: str, message: str
) -> None:
    directory = write_checkpoint()
    (directory / file).write_text(content, encoding="utf-8")
    with pytest.raises(ModelLoadError, match=message):
        load_model(spec(directory))


def test_registry_fails_on_the_first_broken_model(
    write_checkpoint: WriteCheckpoint,
    models_yaml: Callable[[dict[str, Path]], Path],
    tmp_path: Path,
) -> None:
    entries = {"good": write_checkpoint("good"), "broken": tmp_path / "missing"}
    catalog = load_catalog(models_yaml(entries), tmp_path)
    with pytest.raises(ModelLoadError, match="model broken"):
        load_registry(catalog)


def test_demo_model(demo_model_dir: Path) -> None:
    model = load_model(spec(demo_model_dir, name="demo-llama"))
    assert model.bos == SpecialToken("<|bos|>", 0)
    assert model.eos == SpecialToken("<|eos|>", 1)
    assert [t.text for t in model.special_tokens][3:] == ["<|system|>", "<|user|>", "<|assistant|>"]
    assert not model.chat_template.is_default
