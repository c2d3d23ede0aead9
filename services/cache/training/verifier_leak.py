"""Fails the data build when a training or tuning sentence is a held-out sentence or a
near-duplicate of one: the frozen held-out set (bench/data/semantic-cache/held_out.jsonl)
must measure wordings the verifier never saw.

Near-duplicate: the same after normalising (case, punctuation, spaces), or the cache
encoder's cosine at least `NEAR_COSINE`. Only the offending generated sentence is printed.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import numpy.typing as npt

from llm_cache.encoder import Encoder, default_model_dir

NEAR_COSINE = 0.95


class HeldOutLeakError(Exception):
    """Generated data repeats the held-out set."""


def normalise(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def held_out_texts(path: Path) -> list[str]:
    with path.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return sorted({t for r in rows for t in (r["a"], r["b"])})


def _vectors(encoder: Encoder, texts: list[str]) -> npt.NDArray[np.float32]:
    parts = [encoder.encode(texts[i : i + 128]).vectors for i in range(0, len(texts), 128)]
    return np.concatenate(parts).astype(np.float32)


def check(texts: Iterable[str], held_out: Path) -> dict[str, float]:
    """Raises HeldOutLeakError on an exact (normalised) or high-cosine match; returns the
    largest cosine found and the sizes compared."""
    generated = sorted(set(texts))
    frozen = held_out_texts(held_out)
    exact = {normalise(t) for t in frozen}
    same = [t for t in generated if normalise(t) in exact]
    if same:
        raise HeldOutLeakError(f"{len(same)} generated sentences equal held-out ones: {same[:3]}")
    encoder = Encoder(default_model_dir())
    held = _vectors(encoder, frozen)
    worst, offending = 0.0, []
    for i in range(0, len(generated), 2048):
        chunk = generated[i : i + 2048]
        best = (_vectors(encoder, chunk) @ held.T).max(axis=1)
        worst = max(worst, float(best.max()))
        offending += [t for t, c in zip(chunk, best, strict=True) if c >= NEAR_COSINE]
    if offending:
        raise HeldOutLeakError(
            f"{len(offending)} generated sentences within cosine {NEAR_COSINE} of held-out "
            f"ones: {offending[:5]}"
        )
    return {"generated": len(generated), "held_out": len(frozen), "max_cosine": round(worst, 4)}
