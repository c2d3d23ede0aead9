"""Build the demo checkpoint: a small seeded random Llama plus a byte-level BPE trained on corpus/.

Usage: python infra/model/build_demo_model.py --out .cache/demo-model [--seed 0] [--force]
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import safetensors
import tokenizers
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

# The tools section the default template renders, so both speak to models alike.
from llm_common.tokenization.chat_template import TOOLS_INSTRUCTION, TOOLS_PREAMBLE

log = logging.getLogger("build_demo_model")

# Bump when the output format or content changes, so existing checkpoints are rebuilt.
BUILD_VERSION = 1
HERE = Path(__file__).resolve().parent
CORPUS_DIR = HERE / "corpus"
# The corpus (hence the tokenizer) is independent of --seed: every seed shares one vocabulary.
CORPUS_SEED = 20240601
CORPUS_PARAGRAPHS = 2500

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
CHAT_MARKERS = ("<|system|>", "<|user|>", "<|assistant|>")
# Trained first, so they get ids 0..5 in this order.
SPECIAL_TOKENS = (BOS, EOS, PAD, *CHAT_MARKERS)

# ChatML-like: <|role|>\ncontent<|eos|>\n per message; BOS comes from the template, so callers
# encode the rendered text with add_special_tokens=False (as apply_chat_template does).
# With tools, a system turn lists them and asks for Hermes-style calls (the demo model's
# tool_parser is hermes): <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>.
# Assistant calls render as such blocks; tool results (which must name the call they answer)
# as <tool_response> in a user turn.
# A conversation without tools or tool messages renders as before.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}"
    "{{ '<|system|>\\n' }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
    "{{ " + json.dumps(TOOLS_PREAMBLE) + " }}"
    "{% for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}"
    "{{ " + json.dumps(TOOLS_INSTRUCTION) + " + eos_token + '\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{ raise_exception('Unsupported role: ' + message['role']) }}"
    "{% endif %}"
    "{% if tools and loop.first and message['role'] == 'system' %}{# in the tools turn #}"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] is defined %}"
    "{{ '<|assistant|>\\n' + message['content'] }}"
    "{% for call in message['tool_calls'] %}"
    "{% if message['content'] or not loop.first %}{{ '\\n' }}{% endif %}"
    "{{ '<tool_call>\\n' }}"
    "{{ {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson }}"
    "{{ '\\n</tool_call>' }}"
    "{% endfor %}"
    "{{ eos_token + '\\n' }}"
    "{% elif message['role'] == 'tool' and message['tool_call_id'] is not defined %}"
    "{{ raise_exception('A tool message must answer a call (tool_call_id)') }}"
    "{% elif message['role'] == 'tool' %}"
    "{{ '<|user|>\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{{ eos_token + '\\n' }}"
    "{% else %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

OUTPUT_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "build_info.json",
)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """Shape of the demo Llama (GQA: 8 query heads share 4 KV heads)."""

    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    # HF's default 0.02 gives near-flat logits and greedy output repeats one token;
    # 0.2 gives logits std ~3 and varied output (see inference-engine reference §7).
    initializer_range: float = 0.2

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def hf_config(self, bos_id: int, eos_id: int, pad_id: int) -> dict[str, Any]:
        """config.json; carries both the transformers 4.x and 5.x spellings of rope/dtype."""
        return {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            **asdict(self),
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
            "attention_bias": False,
            "attention_dropout": 0.0,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "use_cache": True,
            "bos_token_id": bos_id,
            "eos_token_id": eos_id,
            "pad_token_id": pad_id,
            "torch_dtype": "float32",
            "dtype": "float32",
        }


# ---------------------------------------------------------------- corpus


def load_templates() -> dict[str, list[str]]:
    with (CORPUS_DIR / "templates.json").open(encoding="utf-8") as f:
        data: dict[str, list[str]] = json.load(f)
    return data


def _prose(rng: random.Random, t: dict[str, list[str]]) -> str:
    def clause() -> str:
        subject, verb = rng.choice(t["subjects"]), rng.choice(t["verbs"])
        return f"{subject} {verb} {rng.choice(t['objects'])}, {rng.choice(t['adjectives'])}"

    first = f"{clause()} {rng.choice(t['places'])} {rng.choice(t['times'])}"
    if rng.random() < 0.5:
        first += f" {rng.choice(t['connectors'])} {clause()}"
    end = rng.choice([".", ".", ".", "!", "?", "…"])
    return first[0].upper() + first[1:] + end


def _numbers(rng: random.Random, t: dict[str, list[str]]) -> str:
    n, m = rng.randint(0, 10 ** rng.randint(1, 7)), rng.randint(2, 9)
    return rng.choice(
        [
            f"Invoice {n} is due on {rng.randint(2000, 2030)}-{rng.randint(1, 12):02d}-"
            f"{rng.randint(1, 28):02d} for ${rng.uniform(1, 5000):,.2f}.",
            f"{n:,} {rng.choice(t['names'])}s took {rng.uniform(0, 99):.3f} s "
            f"({rng.randint(0, 100)}%).",
            f"{rng.randint(0, 999)} + {m} = ? and {n} × {m} = {n * m}; ratio {rng.random():.4f}.",
            f"At {rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} the meter read {n} kWh "
            f"and {rng.uniform(-30, 45):.1f} °C.",
        ]
    )


def _code(rng: random.Random, t: dict[str, list[str]]) -> str:
    a, b = rng.sample(t["names"], 2)
    k = rng.randint(1, 64)
    return rng.choice(
        [
            f"def {a}_{b}(x: int) -> int:\n    if x < {k}:\n        return x * {k}\n"
            f"    return {a}_{b}(x // 2) + 1\n",
            f'{{"{a}": {k}, "{b}": [{k}, {k * 2}, null], "ok": {str(k % 2 == 0).lower()}}}',
            f"for {a} in {b}s:\n    total += {a}.size  # {rng.choice(t['verbs'])} {k} {b}s\n",
            f"let {a} = {b}.iter().map(|v| v * {k}).collect::<Vec<_>>();",
            f"{a.upper()}_{b.upper()}={k} ./run.sh --{a}={k} --{b} >> /tmp/{a}.log 2>&1",
        ]
    )


def _unicode(rng: random.Random, t: dict[str, list[str]]) -> str:
    words = rng.sample(t["unicode_words"], 3)
    icons = "".join(rng.choices(t["emoji"], k=rng.randint(1, 3)))
    return f"{words[0]}, {words[1]} {icons} {words[2]} — {_prose(rng, t)} {rng.choice(t['emoji'])}"


def _lexicon(rng: random.Random, t: dict[str, list[str]]) -> str:
    # Loose word sequences: spreads merges over many word types, not just the template phrases.
    words = rng.sample(t["lexicon"], rng.randint(5, 14))
    punct = rng.choice([",", ";", " -", ":"])
    half = len(words) // 2
    text = " ".join(words[:half]) + punct + " " + " ".join(words[half:])
    return text[0].upper() + text[1:] + rng.choice([".", ".", "!", "?"])


def _chat(rng: random.Random, t: dict[str, list[str]]) -> str:
    i = rng.randrange(len(t["questions"]))
    return f"User: {t['questions'][i]}\nAssistant: {t['answers'][i]} {rng.choice(t['emoji'])}"


GENERATORS: tuple[Callable[[random.Random, dict[str, list[str]]], str], ...] = (
    _prose,
    _lexicon,
    _lexicon,
    _numbers,
    _code,
    _unicode,
    _chat,
)


def corpus_documents() -> Iterator[str]:
    """Hand-written paragraphs from corpus/*.txt, then templated ones (fixed RNG)."""
    for path in sorted(CORPUS_DIR.glob("*.txt")):
        yield from (p + "\n" for p in path.read_text(encoding="utf-8").split("\n\n"))
    rng = random.Random(CORPUS_SEED)
    t = load_templates()
    for _ in range(CORPUS_PARAGRAPHS):
        gen = rng.choice(GENERATORS)
        yield "\n".join(gen(rng, t) for _ in range(rng.randint(1, 4))) + "\n"


# ---------------------------------------------------------------- tokenizer


def train_tokenizer(vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        # All 256 bytes, so any UTF-8 text encodes without an unknown token.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(corpus_documents(), trainer=trainer)
    # Llama-3 style: encode(text) starts with BOS unless add_special_tokens=False.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A:0",
        pair=f"{BOS} $A:0 {BOS}:1 $B:1",
        special_tokens=[(BOS, special_ids(tok)[BOS])],
    )
    return tok


def special_ids(tok: Tokenizer) -> dict[str, int]:
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    missing = [t for t, i in ids.items() if i is None]
    if missing:
        raise RuntimeError(f"special tokens missing from the trained vocab: {missing}")
    return {t: i for t, i in ids.items() if i is not None}


def tokenizer_config(model_max_length: int) -> dict[str, Any]:
    return {
        # Not LlamaTokenizer: that class assumes SentencePiece/Metaspace, this is byte-level.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "additional_special_tokens": list(CHAT_MARKERS),
        "model_max_length": model_max_length,
        # Default cleanup rewrites " ." to "." and breaks the decode(encode(x)) == x round trip.
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "chat_template": CHAT_TEMPLATE,
    }


def special_tokens_map() -> dict[str, Any]:
    return {
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "additional_special_tokens": list(CHAT_MARKERS),
    }


# ---------------------------------------------------------------- weights


def init_weights(cfg: ModelConfig, seed: int, silenced_ids: list[int]) -> dict[str, torch.Tensor]:
    """HF Llama parameter names; normal(0, initializer_range) matrices, unit RMSNorm gains."""
    gen = torch.Generator().manual_seed(seed)

    def normal(rows: int, cols: int) -> torch.Tensor:
        # float64 sampling, then rounding: torch's float32 normal_ uses SIMD math that differs
        # by CPU capability (AVX2 vs scalar), the float64 path gives the same bytes on both.
        t = torch.empty(rows, cols, dtype=torch.float64)
        return t.normal_(0.0, cfg.initializer_range, generator=gen).to(torch.float32)

    h, kv = cfg.hidden_size, cfg.num_key_value_heads * cfg.head_dim
    w = {"model.embed_tokens.weight": normal(cfg.vocab_size, h)}
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = normal(h, h)
        w[p + "self_attn.k_proj.weight"] = normal(kv, h)
        w[p + "self_attn.v_proj.weight"] = normal(kv, h)
        w[p + "self_attn.o_proj.weight"] = normal(h, h)
        w[p + "mlp.gate_proj.weight"] = normal(cfg.intermediate_size, h)
        w[p + "mlp.up_proj.weight"] = normal(cfg.intermediate_size, h)
        w[p + "mlp.down_proj.weight"] = normal(h, cfg.intermediate_size)
        w[p + "input_layernorm.weight"] = torch.ones(h)
        w[p + "post_attention_layernorm.weight"] = torch.ones(h)
    w["model.norm.weight"] = torch.ones(h)
    lm_head = normal(cfg.vocab_size, h)
    # A zero row gives logit 0, far below the top logits: the model never emits BOS/PAD/role
    # markers greedily, so demo output stays text. EOS keeps its random row.
    lm_head[silenced_ids] = 0.0
    w["lm_head.weight"] = lm_head
    return w


def count_params(weights: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() for t in weights.values())


# ---------------------------------------------------------------- output


def inputs_digest() -> str:
    """Hash of everything that determines the output except the seed."""
    h = hashlib.sha256()
    h.update(f"v{BUILD_VERSION} {torch.__version__} {tokenizers.__version__}".encode())
    h.update(f" {safetensors.__version__}".encode())
    h.update(CHAT_TEMPLATE.encode())  # parts of it come from llm_common
    corpus = sorted(p for p in CORPUS_DIR.iterdir() if p.is_file())
    for path in [Path(__file__).resolve(), *corpus]:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def build_info(seed: int) -> dict[str, Any]:
    return {"version": BUILD_VERSION, "seed": seed, "inputs_sha256": inputs_digest()}


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def is_complete(out_dir: Path, info: dict[str, Any]) -> bool:
    if not all((out_dir / name).is_file() for name in OUTPUT_FILES):
        return False
    try:
        found = json.loads((out_dir / "build_info.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(found, dict) and all(found.get(k) == v for k, v in info.items())


def write_checkpoint(out_dir: Path, seed: int, cfg: ModelConfig) -> dict[str, Any]:
    """Write every file except build_info.json; return a summary for the log."""
    tok = train_tokenizer(cfg.vocab_size)
    ids = special_ids(tok)
    # The model vocab is the tokenizer's actual size (the trainer may stop short of the target).
    cfg = ModelConfig(**{**asdict(cfg), "vocab_size": tok.get_vocab_size()})
    bos_id, eos_id, pad_id = ids[BOS], ids[EOS], ids[PAD]
    tok.save(str(out_dir / "tokenizer.json"))
    write_json(out_dir / "tokenizer_config.json", tokenizer_config(cfg.max_position_embeddings))
    write_json(out_dir / "special_tokens_map.json", special_tokens_map())
    write_json(out_dir / "config.json", cfg.hf_config(bos_id, eos_id, pad_id))
    generation = {"bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id}
    write_json(out_dir / "generation_config.json", generation)
    silenced = [i for t, i in ids.items() if t != EOS]
    weights = init_weights(cfg, seed, silenced)
    save_file(weights, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    return {"params": count_params(weights), "vocab": cfg.vocab_size, "special_ids": ids}


def make_readable(out_dir: Path) -> None:
    """mkdtemp (and safetensors) create owner-only modes; services may run as another user."""
    out_dir.chmod(0o755)
    for path in out_dir.iterdir():
        path.chmod(0o644)


def check_replaceable(out_dir: Path) -> None:
    """Never delete a directory this script did not create (e.g. a mistyped --out)."""
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "build_info.json").is_file():
        raise FileExistsError(f"{out_dir} exists and is not a demo-model checkpoint")


def replace_dir(src: Path, dst: Path) -> None:
    """Move src to dst; an existing dst is moved aside first (rename cannot replace a full dir)."""
    old = dst.with_name(f".{dst.name}.old-{os.getpid()}")
    shutil.rmtree(old, ignore_errors=True)
    if dst.exists():
        dst.rename(old)
    src.rename(dst)
    shutil.rmtree(old, ignore_errors=True)


def build(out_dir: Path, seed: int = 0, force: bool = False) -> Path:
    """Build the checkpoint into out_dir unless it already holds this exact build."""
    write = functools.partial(write_checkpoint, seed=seed, cfg=ModelConfig())
    return build_atomically(Path(out_dir), build_info(seed), force, write)


def build_atomically(
    out_dir: Path, info: dict[str, Any], force: bool, write: Callable[[Path], dict[str, Any]]
) -> Path:
    """`write` into a fresh sibling directory, renamed into place, unless already built."""
    if not force and is_complete(out_dir, info):
        log.info("up to date: %s (seed %s)", out_dir, info.get("seed"))
        return out_dir
    check_replaceable(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    # Build next to out_dir so the final rename stays on one filesystem (atomic).
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        start = time.perf_counter()
        summary = write(tmp)
        write_json(tmp / "build_info.json", info)  # written last: marks the build complete
        make_readable(tmp)
        replace_dir(tmp, out_dir)
        log.info("built %s in %.1f s: %s", out_dir, time.perf_counter() - start, summary)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


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
