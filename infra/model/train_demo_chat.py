"""Train `demo-chat`: the demo Llama shape, trained on Python's documentation, then on chats.

Usage: python infra/model/train_demo_chat.py --out infra/model/demo-chat [--steps 1500]
       [--sources DIR] [--seed 0] [--random-baseline .cache/models/demo-llama]

Data: demo_chat_data.py (Debian's python3.11-doc, PSF licence). Deterministic for a seed and
a torch version on one machine (CPU, fixed thread count). Writes a Hugging Face checkpoint
(the demo tokenizer format and chat template, trained on this text), `train_report.json`
(held-out perplexity of the trained and of a random model of the same shape and tokenizer,
samples) and `loss.png`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Siblings, not a package: run as a script (its directory is on sys.path); mypy sees them as
# infra.model.*, hence the ignores.
import demo_chat_data as data  # type: ignore[import-not-found]
import torch
from build_demo_model import (  # type: ignore[import-not-found]
    BOS,
    EOS,
    PAD,
    SPECIAL_TOKENS,
    ModelConfig,
    special_ids,
    special_tokens_map,
    tokenizer_config,
    write_json,
)
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

log = logging.getLogger("train_demo_chat")
HERE = Path(__file__).resolve().parent
DEFAULT_STEPS = 800


@dataclass(frozen=True, slots=True)
class TrainConfig:
    seed: int = 0
    steps: int = DEFAULT_STEPS
    batch: int = 16
    seq_len: int = 256
    lr: float = 3e-3
    warmup: int = 60
    weight_decay: float = 0.05
    chat_from: float = 0.55  # fraction of steps after which chats join the batches
    chat_share: float = 0.5  # share of rows that are chats from then on
    chat_examples: int = 12000
    eval_every: int = 100
    threads: int = 2


def train_tokenizer(texts: list[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A:0",
        pair=f"{BOS} $A:0 {BOS}:1 $B:1",
        special_tokens=[(BOS, special_ids(tok)[BOS])],
    )
    return tok


def encode_docs(tok: Tokenizer, texts: list[str], eos: bool) -> list[list[int]]:
    """Each text as BOS + tokens (+ EOS for prose; a rendered chat ends in its own EOS)."""
    eos_id = special_ids(tok)[EOS]
    out = []
    for enc in tok.encode_batch(texts):
        out.append([*enc.ids, eos_id] if eos else list(enc.ids))
    return out


class Stream:
    """Documents packed end to end; windows start at a document's first token."""

    def __init__(self, docs: list[list[int]]) -> None:
        self.tokens = torch.tensor([t for d in docs for t in d], dtype=torch.long)
        starts, pos = [], 0
        for d in docs:
            starts.append(pos)
            pos += len(d)
        self.starts = starts

    def window(self, rng: random.Random, length: int) -> torch.Tensor:
        limit = len(self.tokens) - length - 1
        start = min(rng.choice(self.starts), limit)
        return self.tokens[start : start + length + 1]


def build_model(cfg: ModelConfig, ids: dict[str, int], seed: int) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    hf = cfg.hf_config(ids[BOS], ids[EOS], ids[PAD])
    return LlamaForCausalLM(LlamaConfig(**hf)), hf


def lr_at(step: int, t: TrainConfig) -> float:
    if step < t.warmup:
        return t.lr * (step + 1) / t.warmup
    progress = (step - t.warmup) / max(1, t.steps - t.warmup)
    return t.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def perplexity(model: Any, docs: list[list[int]], seq_len: int) -> float:
    """Token-level perplexity over every held-out document (each from its BOS)."""
    model.eval()
    total, count = 0.0, 0
    for d in docs:
        for i in range(0, len(d) - 1, seq_len):
            chunk = torch.tensor([d[i : i + seq_len + 1]])
            if chunk.shape[1] < 2:
                continue
            out = model(input_ids=chunk[:, :-1], labels=chunk[:, :-1].clone())
            # HF shifts labels itself: labels == inputs gives the next-token loss.
            n = chunk.shape[1] - 2
            if n > 0:
                total += float(out.loss) * n
                count += n
    model.train()
    return math.exp(total / max(1, count))


def generate(model: Any, tok: Tokenizer, prompt: str, max_new: int = 80) -> str:
    ids = tok.encode(prompt, add_special_tokens=False).ids
    eos_id = special_ids(tok)[EOS]
    model.eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=eos_id,
            pad_token_id=eos_id,
            repetition_penalty=1.1,
        )
    model.train()
    return tok.decode(out[0, len(ids) :].tolist(), skip_special_tokens=True)


def chat_prompt(user: str) -> str:
    return f"{BOS}<|user|>\n{user}{EOS}\n<|assistant|>\n"


def plot_loss(path: Path, train: list[tuple[int, float]], held: list[tuple[int, float]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(*zip(*train, strict=True), label="train (mixed batches)", linewidth=1)
    ax.plot(*zip(*held, strict=True), "o-", label="held-out prose", markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title("demo-chat training loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_checksums(
    out: Path, names: tuple[str, ...] = ("model.safetensors", "tokenizer.json")
) -> None:
    """SHA256SUMS (sha256sum's format): `make up` refuses the checkpoint when they differ."""
    lines = [f"{hashlib.sha256((out / n).read_bytes()).hexdigest()}  {n}\n" for n in names]
    (out / "SHA256SUMS").write_text("".join(lines), encoding="utf-8")


def train(out: Path, sources: Path, t: TrainConfig) -> dict[str, Any]:
    torch.set_num_threads(t.threads)
    random.seed(t.seed)
    paragraphs = data.load_paragraphs(sources)
    train_p, held_p = data.split(paragraphs)
    chats = data.chat_examples(train_p, t.chat_examples, t.seed)
    shape = ModelConfig(initializer_range=0.02)
    tok = train_tokenizer([p.text for p in train_p] + chats, shape.vocab_size)
    ids = special_ids(tok)
    shape = ModelConfig(**{**asdict(shape), "vocab_size": tok.get_vocab_size()})
    prose = Stream(encode_docs(tok, [p.text for p in train_p], eos=True))
    chat = Stream(encode_docs(tok, chats, eos=False))
    held = encode_docs(tok, [p.text for p in held_p], eos=True)
    log.info("train %d tokens, chats %d tokens", len(prose.tokens), len(chat.tokens))

    model, hf = build_model(shape, ids, t.seed)
    params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": t.weight_decay}, {"params": rest, "weight_decay": 0}],
        lr=t.lr,
        betas=(0.9, 0.95),
    )
    rng = random.Random(t.seed)
    losses: list[tuple[int, float]] = []
    held_curve: list[tuple[int, float]] = []
    started = time.perf_counter()
    for step in range(t.steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, t)
        share = t.chat_share if step >= t.chat_from * t.steps else 0.0
        rows = [
            (chat if rng.random() < share else prose).window(rng, t.seq_len) for _ in range(t.batch)
        ]
        batch = torch.stack(rows)
        loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1].clone()).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append((step, float(loss.detach())))
        if step % 25 == 0:
            log.info("step %d loss %.3f (%.0f s)", step, float(loss), time.perf_counter() - started)
        if step % t.eval_every == 0 or step == t.steps - 1:
            ppl = perplexity(model, held[:60], t.seq_len)
            held_curve.append((step, math.log(ppl)))
            log.info(
                "step %d loss %.3f held-out ppl %.1f (%.0f s)",
                step, float(loss), ppl, time.perf_counter() - started,
            )  # fmt: skip
    elapsed = time.perf_counter() - started

    out.mkdir(parents=True, exist_ok=True)
    weights = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    write_json(out / "config.json", hf)
    write_json(out / "generation_config.json", {k + "_token_id": ids[v] for k, v in (
        ("bos", BOS), ("eos", EOS), ("pad", PAD))})  # fmt: skip
    tok.save(str(out / "tokenizer.json"))
    write_json(out / "tokenizer_config.json", tokenizer_config(shape.max_position_embeddings))
    write_json(out / "special_tokens_map.json", special_tokens_map())
    write_checksums(out)

    trained_ppl = perplexity(model, held, t.seq_len)
    random_model, _ = build_model(
        ModelConfig(**{**asdict(shape), "initializer_range": 0.2}), ids, 0
    )
    random_ppl = perplexity(random_model, held, t.seq_len)
    prompts = ["Tell me a story", "What is a list?", "Explain exceptions.", "Hello!"]
    report = {
        "params": params,
        "train_config": asdict(t),
        "data": {
            "package": data.DEBIAN_PACKAGE,
            "licence": "PSF License Agreement (Python documentation)",
            "paragraphs": {"train": len(train_p), "held_out": len(held_p)},
            "train_tokens": len(prose.tokens),
            "chat_tokens": len(chat.tokens),
        },
        "train_seconds": round(elapsed, 1),
        "held_out_perplexity": {
            "trained": round(trained_ppl, 2),
            "random_same_shape_init_0.2": round(random_ppl, 2),
        },
        "samples": {p: generate(model, tok, chat_prompt(p)) for p in prompts},
    }
    write_json(out / "train_report.json", report)
    plot_loss(HERE / "demo_chat_loss.png", losses, held_curve)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=HERE / "demo-chat")
    parser.add_argument("--sources", type=Path, help="unpacked _sources dir (default: fetch)")
    parser.add_argument("--cache", type=Path, default=Path(".cache/demo-chat-data"))
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2, help="torch threads (1 on a busy host)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    sources = args.sources or data.fetch_sources(args.cache)
    report = train(
        args.out, sources, TrainConfig(seed=args.seed, steps=args.steps, threads=args.threads)
    )
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
