"""A tiny tokenizer and checkpoint directory, and a models.yaml naming them, for tests."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer


TINY_BOS, TINY_EOS, TINY_PAD = "<s>", "</s>", "<pad>"
_TINY_CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Tokenizers split text into tokens; detokenizers join them again.",
    "Hello world, hello tokens, hello streams.",
    "日本語のテキストと中文文本 mixed with English words.",
] * 20


def train_tiny_tokenizer() -> Tokenizer:
    """Byte-level BPE with few merges, so most non-ASCII characters span several tokens; BOS is
    added by the post-processor. For tests (needs the `tokenizers` package)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=[TINY_BOS, TINY_EOS, TINY_PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_TINY_CORPUS, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{TINY_BOS} $A", special_tokens=[(TINY_BOS, tok.token_to_id(TINY_BOS))]
    )
    return tok


# A chat template that shows the special tokens and every flag in its output.
TINY_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{{ eos_token }}"
    "{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
)


def write_tiny_checkpoint(
    directory: Path,
    tokenizer: Tokenizer,
    *,
    template: str | None = TINY_CHAT_TEMPLATE,
    **config: object,
) -> Path:
    """`directory` made a tokenizer-only checkpoint: tokenizer.json and a tokenizer_config.json
    naming the TINY_* special tokens, `template` (None: no template) and `config` on top."""
    directory.mkdir()
    tokenizer.save(str(directory / "tokenizer.json"))
    data: dict[str, object] = {"bos_token": TINY_BOS, "eos_token": TINY_EOS, "pad_token": TINY_PAD}
    if template is not None:
        data["chat_template"] = template
    data.update(config)
    (directory / "tokenizer_config.json").write_text(json.dumps(data), encoding="utf-8")
    return directory


def write_models_yaml(path: Path, entries: Mapping[str, Path], context_length: int = 2048) -> Path:
    """A models.yaml with one generation model per entry (name -> checkpoint dir), each
    aliased `<name>-alias`."""
    lines = ["models:"]
    for name, checkpoint in entries.items():
        lines += [
            f"  - name: {name}",
            f"    aliases: [{name}-alias]",
            f"    checkpoint: {checkpoint}",
            f"    context_length: {context_length}",
        ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
