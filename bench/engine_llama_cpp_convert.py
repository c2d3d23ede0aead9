"""Run llama.cpp's HF -> GGUF converter (convert_hf_to_gguf.py from the llama-cpp-python sdist)
on a checkpoint with a byte-level BPE tokenizer the converter does not know by hash.

The converter identifies a BPE tokenizer's pre-tokenizer by hashing the token ids it produces
for a fixed text, and refuses hashes missing from its table (its update script adds entries for
published Hugging Face models only). Our checkpoints' pre-tokenizer is exactly GPT-2's
(tokenizers' ByteLevel with use_regex, no normalizer), which llama.cpp implements as "gpt-2"; the
hash differs only because the vocabulary does. So, for a checkpoint whose tokenizer.json says
that and nothing else, an unrecognised hash is mapped to "gpt-2" - the entry the update script
would add - without editing the vendored file; any other tokenizer still fails as before.
bench/engine_llama_cpp.py then checks llama.cpp's tokenization against ours (docs/adr).

Usage: python bench/engine_llama_cpp_convert.py CONVERTER_DIR MODEL_DIR OUT.gguf OUTTYPE
"""

from __future__ import annotations

import importlib
import json
import runpy
import sys
from pathlib import Path
from typing import Any

GPT2_PRE = "gpt-2"


def is_gpt2_byte_level(model_dir: Path) -> bool:
    """tokenizer.json pre-tokenizes exactly as GPT-2 does (ByteLevel + its regex, no prefix
    space, no normalizer)."""
    try:
        spec = json.loads((model_dir / "tokenizer.json").read_text("utf-8"))
    except (OSError, ValueError):
        return False
    pre = spec.get("pre_tokenizer") or {}
    return (
        spec.get("normalizer") is None
        and spec.get("model", {}).get("type") == "BPE"
        and pre.get("type") == "ByteLevel"
        and pre.get("use_regex") is True
        and pre.get("add_prefix_space") is False
    )


def install_gpt2_fallback(base: Any, model_dir: Path) -> None:
    """Wrap TextModel.get_vocab_base_pre: an unknown hash on a GPT-2 byte-level tokenizer
    becomes "gpt-2"; everything else behaves as shipped."""
    original = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self: Any, tokenizer: Any) -> str:
        try:
            return str(original(self, tokenizer))
        except NotImplementedError:
            if not is_gpt2_byte_level(model_dir):
                raise
            return GPT2_PRE

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre


def main(argv: list[str]) -> int:
    converter_dir, model_dir, outfile, outtype = (Path(argv[0]), Path(argv[1]), argv[2], argv[3])
    sys.path[:0] = [str(converter_dir), str(converter_dir / "gguf-py")]
    # The vendored converter package, importable once its directory is on sys.path.
    install_gpt2_fallback(importlib.import_module("conversion.base"), model_dir)
    script = converter_dir / "convert_hf_to_gguf.py"
    sys.argv = [str(script), str(model_dir), "--outfile", outfile, "--outtype", outtype]
    runpy.run_path(str(script), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
