"""Build the benchmark checkpoint: a seeded random ~120M-parameter Llama (GQA), demo tokenizer.

The demo model (5M parameters) measures Python overhead; this one is big enough that matmuls and
attention dominate a step, so engine benchmarks report both. Same tokenizer, chat template and
Hugging Face layout as the demo model (build_demo_model.py), so transformers and llama.cpp's
converter load it unchanged.

Usage: python infra/model/build_bench_model.py --out .cache/models/bench-llama [--seed 0] [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import logging
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from safetensors.torch import save_file

log = logging.getLogger("build_bench_model")
HERE = Path(__file__).resolve().parent

# Bump when the output format or content changes, so existing checkpoints are rebuilt.
BENCH_BUILD_VERSION = 1

# 10 layers x (Q/O 1024x1024, K/V 256x1024, MLP 3 x 1024x2816) + 2 x 4096x1024 embeddings:
# 120.6M parameters. 16 query heads share 4 KV heads (GQA 4:1), head_dim 64 like most 7B models.
BENCH_SHAPE: dict[str, Any] = {
    "vocab_size": 4096,
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 10,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "max_position_embeddings": 4096,
    # logits std ~3 at hidden 1024 (0.2 suits hidden 256): varied greedy output, no overflow.
    "initializer_range": 0.1,
}


def demo_builder() -> ModuleType:
    """build_demo_model.py, loaded by path (infra/model is not a package); cached per process."""
    if "build_demo_model" in sys.modules:
        return sys.modules["build_demo_model"]
    spec = importlib.util.spec_from_file_location("build_demo_model", HERE / "build_demo_model.py")
    if spec is None or spec.loader is None:
        raise ImportError("build_demo_model.py not found next to build_bench_model.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while decorating
    spec.loader.exec_module(module)
    return module


def build_info(seed: int) -> dict[str, Any]:
    """The demo inputs (tokenizer corpus, template) plus this file and the shape."""
    h = hashlib.sha256(str(demo_builder().inputs_digest()).encode())
    h.update(Path(__file__).resolve().read_bytes())
    h.update(json.dumps(BENCH_SHAPE, sort_keys=True).encode())
    return {"version": BENCH_BUILD_VERSION, "seed": seed, "inputs_sha256": h.hexdigest()}


def write_checkpoint(out_dir: Path, seed: int) -> dict[str, Any]:
    """Every file except build_info.json; the tokenizer is the demo model's (same corpus)."""
    demo = demo_builder()
    tok = demo.train_tokenizer(BENCH_SHAPE["vocab_size"])
    ids: dict[str, int] = demo.special_ids(tok)
    cfg = demo.ModelConfig(**{**BENCH_SHAPE, "vocab_size": tok.get_vocab_size()})
    bos_id, eos_id, pad_id = ids[demo.BOS], ids[demo.EOS], ids[demo.PAD]
    tok.save(str(out_dir / "tokenizer.json"))
    max_len = cfg.max_position_embeddings
    demo.write_json(out_dir / "tokenizer_config.json", demo.tokenizer_config(max_len))
    demo.write_json(out_dir / "special_tokens_map.json", demo.special_tokens_map())
    demo.write_json(out_dir / "config.json", cfg.hf_config(bos_id, eos_id, pad_id))
    generation = {"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id}
    demo.write_json(out_dir / "generation_config.json", generation)
    weights = demo.init_weights(cfg, seed, [i for t, i in ids.items() if t != demo.EOS])
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return {"params": int(demo.count_params(weights)), "vocab": int(cfg.vocab_size)}


def build(out_dir: Path, seed: int = 0, force: bool = False) -> Path:
    """Build into out_dir unless it already holds this exact build (atomic rename)."""
    demo = demo_builder()
    return Path(
        demo.build_atomically(
            Path(out_dir), build_info(seed), force, lambda tmp: write_checkpoint(tmp, seed)
        )
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, required=True, help="checkpoint directory to create")
    parser.add_argument("--seed", type=int, default=0, help="weight init seed (default 0)")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    build(args.out, seed=args.seed, force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
