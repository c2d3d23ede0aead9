"""demo-chat: the data recipe, and the committed checkpoint (servable, template kept, English)."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
CHECKPOINT = HERE / "demo-chat"
RST = """\
.. _tut-intro:

Lists and Loops
===============

Python knows a number of *compound* data types, used to group together other
values. The most versatile is the :ref:`list <tut-lists>`, which can be written as
``[1, 2]``.

   >>> squares = [1, 4, 9]

.. note::

   A directive is not prose.

Short.
"""


def _load(name: str) -> ModuleType:
    # Not a package: load by path (the root config uses --import-mode=importlib).
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))  # the siblings import each other by name
    spec = importlib.util.spec_from_file_location(name, HERE / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def data() -> ModuleType:
    return _load("demo_chat_data")


def test_only_prose_paragraphs_are_kept_without_markup(data: Any) -> None:
    found = list(data.paragraphs_of(RST))
    assert len(found) == 1
    assert found[0].topic == "Lists and Loops"
    assert found[0].text == (
        "Python knows a number of compound data types, used to group together other values. "
        "The most versatile is the list, which can be written as [1, 2]."
    )


def test_the_split_is_by_content(data: Any) -> None:
    texts = [f"Paragraph number {i} says something." for i in range(2000)]
    held = [t for t in texts if data.is_held_out(t)]
    assert 0 < len(held) < 100  # about 2 %
    assert [t for t in reversed(texts) if data.is_held_out(t)] == held[::-1]


def test_chats_render_as_the_demo_template(data: Any) -> None:
    import jinja2.sandbox

    builder = _load("build_demo_model")
    env = jinja2.sandbox.ImmutableSandboxedEnvironment()
    template = env.from_string(builder.CHAT_TEMPLATE)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
    ]
    rendered = template.render(
        messages=messages, bos_token=builder.BOS, eos_token=builder.EOS, tools=None
    )
    assert rendered == builder.BOS + data.render_chat("Hi", "Hello.", system="Be brief.")


def test_chat_examples_are_deterministic(data: Any) -> None:
    paragraphs = [
        data.Paragraph(f"Topic {i}", f"Sentence {i} is here. Another one follows.")
        for i in range(20)
    ]
    first = data.chat_examples(paragraphs, 50, seed=3)
    assert first == data.chat_examples(paragraphs, 50, seed=3)
    assert all(c.startswith("<|user|>\n") and c.endswith("<|eos|>\n") for c in first)
    answers = [c.split("<|assistant|>\n")[1].removesuffix("<|eos|>\n") for c in first]
    assert any(a.startswith("{") and json.loads(a)["topic"] for a in answers)


# ---------------------------------------------------------------- the committed checkpoint


def test_committed_checkpoint_is_servable_and_small() -> None:
    from llm_stack.checkpoint import validate, verify_checksums

    facts = validate(CHECKPOINT, replicas=2)
    assert facts.model_type == "llama"
    assert 3_000_000 <= facts.parameters <= 30_000_000
    assert verify_checksums(CHECKPOINT) == 2
    assert (CHECKPOINT / "model.safetensors").stat().st_size <= 60 * 2**20


def test_committed_checkpoint_keeps_the_demo_chat_template() -> None:
    builder = _load("build_demo_model")
    config = json.loads((CHECKPOINT / "tokenizer_config.json").read_text())
    assert config["chat_template"] == builder.CHAT_TEMPLATE
    assert config["bos_token"] == builder.BOS


def test_trained_perplexity_is_far_below_random() -> None:
    report = json.loads((CHECKPOINT / "train_report.json").read_text())
    ppl = report["held_out_perplexity"]
    assert ppl["trained"] * 20 < ppl["random_same_shape_init_0.2"]


def test_greedy_reply_is_english_words() -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tok = Tokenizer.from_file(str(CHECKPOINT / "tokenizer.json"))
    model: Any = AutoModelForCausalLM.from_pretrained(str(CHECKPOINT), dtype=torch.float32)
    model.eval()
    prompt = "<|bos|><|user|>\nTell me a story<|eos|>\n<|assistant|>\n"
    ids = tok.encode(prompt, add_special_tokens=False).ids
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]), max_new_tokens=40, do_sample=False, repetition_penalty=1.1
        )
    text = tok.decode(out[0, len(ids) :].tolist(), skip_special_tokens=True)
    words = re.findall(r"[A-Za-z]+", text)
    assert len(words) >= 5, text
    vocabulary = set(re.findall(r"[a-z]+", (CHECKPOINT / "tokenizer.json").read_text().lower()))
    known = [w for w in words if w.lower() in vocabulary or len(w) <= 3]
    assert len(known) >= 0.8 * len(words), text
