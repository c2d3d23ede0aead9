"""GGUF files for the llama.cpp comparison: converted from the same checkpoint by the converter
shipped in the installed llama-cpp-python's source distribution, cached under .cache, and checked
by comparing llama.cpp's tokenization with the checkpoint's tokenizer."""

from __future__ import annotations

import hashlib
import importlib
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
LLAMA_CPP_CACHE = ROOT / ".cache" / "llama-cpp"
# Text the tokenizers are compared on: prose, code, digits, whitespace runs, non-Latin scripts.
TOKENIZER_SAMPLE = (
    "The quick brown fox jumps over the lazy dog. I've been 'told' he's there!\n"
    "def add(a, b):\n    return a + b  # 3 33 333 3333\n\n\t tabs\tand   spaces\n"
    "Größe, café, naïve — 東京 🚀 Привет мир 1.5e-3 https://example.com/x?y=1&z=2"
)


def converter_dir(version: str) -> Path:
    """vendor/llama.cpp of the sdist `make llama-cpp` built the installed version from."""
    return LLAMA_CPP_CACHE / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"


def gguf_for(model_dir: Path, version: str, outtype: str) -> Path:
    """The checkpoint converted to GGUF (outtype f32/f16/...), converted once per checkpoint
    content and converter version."""
    key = hashlib.sha256(version.encode())
    for name in ("config.json", "tokenizer.json", "model.safetensors"):
        stat = (model_dir / name).stat()
        key.update(f"{name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    out = LLAMA_CPP_CACHE / "gguf" / f"{model_dir.name}-{outtype}-{key.hexdigest()[:12]}.gguf"
    if out.is_file():
        return out
    source = converter_dir(version)
    if not (source / "convert_hf_to_gguf.py").is_file():
        raise FileNotFoundError(f"no converter at {source}: run `make llama-cpp`")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial")
    command = [sys.executable, str(HERE / "engine_llama_cpp_convert.py"), str(source)]
    command += [str(model_dir), str(partial), outtype]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"GGUF conversion of {model_dir.name} failed:\n{done.stderr[-2000:]}")
    partial.rename(out)
    return out


def tokenizer_agreement(gguf: Path, model_dir: Path) -> dict[str, Any]:
    """llama.cpp's tokenization of TOKENIZER_SAMPLE (from the GGUF vocabulary and its
    pre-tokenizer type) against the checkpoint's tokenizer.json."""
    from tokenizers import Tokenizer

    llama_cpp: Any = importlib.import_module("llama_cpp")  # optional extra (`make llama-cpp`)

    vocab = llama_cpp.Llama(model_path=str(gguf), vocab_only=True, verbose=False)
    theirs = vocab.tokenize(TOKENIZER_SAMPLE.encode(), add_bos=False, special=False)
    ours = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    reference = ours.encode(TOKENIZER_SAMPLE, add_special_tokens=False).ids
    return {"tokens": len(reference), "identical": list(theirs) == list(reference)}
