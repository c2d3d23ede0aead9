"""bench_cache's "held_out" section: the rule guard and the learned verifier side by side on
the frozen held-out set (bench/data/semantic-cache/held_out.jsonl), QQP's non-duplicates,
GPTCache's protocol, per-category precision/recall curves (cache_heldout.png) and the
verifier's own cost.

Decisions compared:
  old_guard        the rule guard with the question margin at the service threshold (the
                   service before issue 37)
  verifier_<mode>  the verifier at the mode's operating point (chosen on the tuning split,
                   services/cache/training/calibrate_verifier.py): cosine >= threshold +
                   the mode's margin (negative: below the threshold), the rule checks kept
                   next to it and the verifier's probability
  cosine_only      the threshold alone
GPTCache's paraphrase pairs: lines 0 and 2 mod 4 are the verifier's training and tuning
data, so every GPTCache figure here is measured on the odd lines only (the caller passes
them).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from llm_cache import guard
from llm_cache.config import SemanticSettings
from llm_cache.verifier import Verifier

Vectors = npt.NDArray[np.float32]
Mask = npt.NDArray[np.bool_]
NEAR_MISS = (
    "comparison_reversed", "output_format", "direction_swapped", "different_operation",
    "different_entity", "negation", "number", "language",
)  # fmt: skip
GOALS = {
    "held_out_near_miss_false_hit_rate": 0.03,
    "held_out_paraphrase_hit_rate": 0.80,
    "qqp_nondup_false_hit_rate": 0.02,
    "gptcache_protocol_precision": 0.97,
    "semantic_p50_ms_at_100k_added": 3.0,
}
VERIFY_TOP = SemanticSettings().verifier_candidates  # nearest candidates the service scores


def proposal_floor(verifier: Verifier, threshold: float) -> float:
    """The lowest cosine any mode proposes to the verifier."""
    return threshold + min(0.0, *(verifier.point(m).similarity_margin for m in verifier.modes))


@dataclass(frozen=True, slots=True)
class Labelled:
    a: str  # stored
    b: str  # query
    category: str


@dataclass(frozen=True, slots=True)
class Decisions:
    """Per pair: which decision serves the query the stored answer, and the raw scores."""

    cosine: npt.NDArray[np.float64]
    prob: npt.NDArray[np.float64]
    old_guard: Mask
    kept_rules: Mask

    def hits(self, threshold: float, verifier: Verifier) -> dict[str, Mask]:
        above = self.cosine >= threshold
        out = {"old_guard": self.old_guard, "cosine_only": above}
        for mode in verifier.modes:
            point = verifier.point(mode)
            close = self.cosine >= threshold + point.similarity_margin
            out[f"verifier_{mode}"] = close & self.kept_rules & (self.prob >= point.probability)
        return out


def load_held_out(path: Path) -> list[Labelled]:
    with path.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [Labelled(r["a"], r["b"], r["category"]) for r in rows]


def decide(
    pairs: Sequence[tuple[str, str]],
    vectors: dict[str, Vectors],
    verifier: Verifier,
    threshold: float,
    margin: float,
) -> Decisions:
    """Scores every pair; the verifier reads only pairs at or above the lowest proposal
    floor (as in the service), the others get probability 0."""
    cosine = np.array([float(vectors[a] @ vectors[b]) for a, b in pairs])
    feats = [(guard.extract(b), guard.extract(a)) for a, b in pairs]
    needed = np.array([guard.required_similarity(q, s, threshold, margin) for q, s in feats])
    old = np.array([guard.check(q, s) is None for q, s in feats], bool) & (cosine >= needed)
    kept = np.array([guard.check_with_verifier(q, s) is None for q, s in feats], bool)
    prob = np.zeros(len(pairs))
    todo = np.flatnonzero(cosine >= proposal_floor(verifier, threshold))
    if todo.size:
        prob[todo] = score_pairs(verifier, [pairs[int(i)] for i in todo])
    return Decisions(cosine, prob, old, kept)


def score_pairs(verifier: Verifier, pairs: Sequence[tuple[str, str]]) -> npt.NDArray[np.float32]:
    texts = sorted({t for p in pairs for t in p})
    tokens = dict(zip(texts, verifier.tokens(texts), strict=True))
    scored = [
        verifier.score([(tokens[a], tokens[b]) for a, b in pairs[i : i + 64]])
        for i in range(0, len(pairs), 64)
    ]
    return np.concatenate(scored)


def held_out_rates(rows: list[Labelled], hit: Mask) -> dict[str, Any]:
    cats = np.array([r.category for r in rows])
    near = np.isin(cats, NEAR_MISS)
    return {
        "paraphrase_hit_rate": round(float(hit[cats == "paraphrase"].mean()), 4),
        "near_miss_false_hit_rate": round(float(hit[near].mean()), 4),
        "near_miss_false_hits": int(hit[near].sum()),
        "unrelated_false_hit_rate": round(float(hit[cats == "unrelated"].mean()), 4),
        "by_category": {c: round(float(hit[cats == c].mean()), 4) for c in sorted(set(cats))},
    }


def gptcache_protocol(
    sources: list[str],
    queries: list[str],
    vectors: dict[str, Vectors],
    verifier: Verifier,
    threshold: float,
    mode: str,
) -> dict[str, float]:
    """All sources stored; as in the service, the nearest VERIFY_TOP sources at or above the
    mode's floor are scored (one verifier pass per query) and the nearest the kept rules and
    the verifier accept is served."""
    stored = np.stack([vectors[s] for s in sources])
    feats = [guard.extract(s) for s in sources]
    tokens = verifier.tokens(sources)
    point = verifier.point(mode)
    floor = threshold + point.similarity_margin
    hits = correct = 0
    for i, query in enumerate(queries):
        sims = stored @ vectors[query]
        order = [j for j in np.argsort(-sims)[:VERIFY_TOP] if sims[j] >= floor]
        if not order:
            continue
        q_feats, q_tokens = guard.extract(query), verifier.tokens([query])[0]
        probs = verifier.score([(tokens[j], q_tokens) for j in order])
        served = next(
            (j for j, p in zip(order, probs, strict=True)
             if p >= point.probability and guard.check_with_verifier(q_feats, feats[j]) is None),
            None,
        )  # fmt: skip
        if served is not None:
            hits += 1
            correct += int(sources[served] == sources[i])
    return {
        "hit_rate": round(hits / len(queries), 4),
        "precision": round(correct / hits, 4) if hits else 0.0,
    }


def verifier_cost(verifier: Verifier, texts: list[str]) -> dict[str, Any]:
    """Milliseconds per verifier pass for 1, 2 and 8 candidates (one lookup's worth)."""
    tokens = verifier.tokens(texts)
    tokens = tokens * (1 + 700 // max(1, len(tokens)))  # enough pairs for short lists
    out: dict[str, Any] = {"dtype": str(verifier.dtype).removeprefix("torch.")}
    for n in (1, 2, 8):
        times = []
        for i in range(0, min(len(tokens) - n, 600), 3):
            pairs = [(tokens[i + k + 1], tokens[i]) for k in range(n)]
            started = time.perf_counter()
            verifier.score(pairs)
            times.append((time.perf_counter() - started) * 1000)
        out[f"candidates_{n}"] = {
            "p50_ms": round(float(np.percentile(times, 50)), 3),
            "p99_ms": round(float(np.percentile(times, 99)), 3),
        }
    return out


def curves(rows: list[Labelled], d: Decisions, floor: float) -> dict[str, Any]:
    """Per near-miss category, over verifier probabilities (cosine >= `floor`): paraphrase hit
    rate (recall) and precision at equal prevalence (as many near-misses of the category as
    paraphrases)."""
    cats = np.array([r.category for r in rows])
    base = (d.cosine >= floor) & d.kept_rules
    para = cats == "paraphrase"
    out: dict[str, Any] = {}
    for cat in (*NEAR_MISS, "unrelated"):
        points = []
        for p in np.linspace(0.0, 0.99, 100):
            hit = base & (d.prob >= p)
            recall, fp = float(hit[para].mean()), float(hit[cats == cat].mean())
            precision = recall / (recall + fp) if recall + fp else 1.0
            points.append({"p": round(float(p), 2), "recall": recall, "precision": precision})
        out[cat] = points
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 3, figsize=(13, 11))
    held = result["held_out"]["held_out"]
    old = held["old_guard"]
    for ax, (cat, points) in zip(axes.flat, held["curves"].items(), strict=True):
        ax.plot([q["recall"] for q in points], [q["precision"] for q in points], label="verifier")
        old_fp = old["by_category"][cat]
        old_recall = old["paraphrase_hit_rate"]
        ax.scatter([old_recall], [old_recall / (old_recall + old_fp) if old_recall + old_fp else 1],
                   color="tab:red", label="old guard", zorder=3)  # fmt: skip
        for mode, color in (("balanced", "tab:green"), ("strict", "tab:purple")):
            v = held[f"verifier_{mode}"]
            r, fp = v["paraphrase_hit_rate"], v["by_category"][cat]
            ax.scatter([r], [r / (r + fp) if r + fp else 1], color=color, label=mode, zorder=3)
        ax.set(title=cat, xlabel="paraphrase hit rate (recall)", ylabel="precision (1:1)",
               xlim=(0, 1), ylim=(0.4, 1.01))  # fmt: skip
        ax.legend(fontsize=7, loc="lower left")
    fig.suptitle("Held-out set: precision/recall by near-miss category (verifier sweep)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def goals(section: dict[str, Any], latency_added_ms: float | None) -> dict[str, Any]:
    v = section["held_out"]["verifier_balanced"]
    qqp = section["qqp_nondup_false_hit_rate"]["verifier_balanced"]
    gptcache = section["gptcache_protocol"]["verifier_balanced"]["precision"]
    checks = {
        "held_out_near_miss_false_hit_rate": (v["near_miss_false_hit_rate"], "<="),
        "held_out_paraphrase_hit_rate": (v["paraphrase_hit_rate"], ">="),
        "qqp_nondup_false_hit_rate": (qqp, "<="),
        "gptcache_protocol_precision": (gptcache, ">="),
    }
    if latency_added_ms is not None:
        checks["semantic_p50_ms_at_100k_added"] = (latency_added_ms, "<=")
    return {
        name: {
            "goal": GOALS[name],
            "measured": round(value, 4),
            "met": value <= GOALS[name] if op == "<=" else value >= GOALS[name],
        }
        for name, (value, op) in checks.items()
    }


def section(
    paraphrases: Sequence[Any],
    qqp: Sequence[Any],
    vectors: dict[str, Vectors],
    verifier: Verifier,
    *,
    held_out: list[Labelled],
    threshold: float,
    margin: float,
) -> dict[str, Any]:
    """The whole "held_out" section (`paraphrases` and `qqp` hold .a, .b, .duplicate)."""
    rows = held_out
    d = decide([(r.a, r.b) for r in rows], vectors, verifier, threshold, margin)
    hits = d.hits(threshold, verifier)
    out: dict[str, Any] = {
        "held_out": {
            "pairs": {
                c: sum(r.category == c for r in rows) for c in sorted({r.category for r in rows})
            },
            **{name: held_out_rates(rows, hit) for name, hit in hits.items()},
            "curves": curves(rows, d, threshold + verifier.point("balanced").similarity_margin),
        },
        "operating_points": {m: asdict(verifier.point(m)) for m in verifier.modes},
    }
    odd = [p for p in qqp[1::2] if not p.duplicate]
    for name, pairs in (
        ("qqp_nondup_false_hit_rate", odd),
        ("qqp_dup_hit_rate", [p for p in qqp[1::2] if p.duplicate]),
        ("qqp_nondup_false_hit_rate_whole_file", [p for p in qqp if not p.duplicate]),
        ("paraphrase_hit_rate", list(paraphrases)),
    ):
        dd = decide([(p.a, p.b) for p in pairs], vectors, verifier, threshold, margin)
        out[name] = {k: round(float(v.mean()), 4) for k, v in dd.hits(threshold, verifier).items()}
    sources, queries = [p.a for p in paraphrases], [p.b for p in paraphrases]
    out["gptcache_protocol"] = {
        f"verifier_{m}": gptcache_protocol(sources, queries, vectors, verifier, threshold, m)
        for m in verifier.modes
    }
    out["verifier_cost"] = verifier_cost(verifier, queries)
    return out
