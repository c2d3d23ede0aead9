"""The verifier's training and tuning pairs: QQP and GPTCache's paraphrase pairs (lines 0 and
2 mod 4), generated paraphrase / near-miss pairs per category from templates over
verifier_vocab's slot values, and everyday request families (verifier_everyday).

Label 1: one answer serves both prompts; 0: it does not. Splits: `train` and `tune` share no
slot value (verifier_vocab.split) and no data-file line; the data files' odd lines are never
read here (the benchmark measures them), and the frozen held-out set is read only by
verifier_leak, which fails the build if a generated sentence repeats a held-out one.
Usage: python services/cache/training/verifier_data.py OUT_DIR  (writes train/tune.jsonl)
"""

from __future__ import annotations

import itertools
import json
import random
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path

import verifier_everyday
import verifier_leak
import verifier_vocab as v
from verifier_types import Example

ROOT = Path(__file__).resolve().parents[3]
DATA = ROOT / "bench" / "data" / "semantic-cache"
QQP = DATA / "qqp_pairs_dev.jsonl"
GPTCACHE = DATA / "paraphrase_pairs.jsonl"
HELD_OUT = DATA / "held_out.jsonl"
SEED = 37


HOW = (
    "How do I {}?", "How can I {}?", "What's the best way to {}?", "What is the way to {}?",
    "Any tips on how to {}?", "Tell me how to {}.", "I want to {}. How?", "Steps to {}?",
    "Explain how to {}.", "how to {}", "Could you tell me how to {}?", "What should I do to {}?",
    "Help me {}.", "what's the easiest way to {}", "Is there a good way to {}?",
)  # fmt: skip
WHAT = (
    "What is {}?", "Explain {}.", "Can you explain {}?", "Tell me about {}.", "Describe {}.",
    "What does {} mean?", "I'd like to understand {}.", "Give me an explanation of {}.",
    "explain {} to me", "What exactly is {}?", "Could you describe {}?",
)  # fmt: skip
COMPARE = (
    "Is {} {} than {}?", "Would you say {} is {} than {}?", "Is it true that {} is {} than {}?",
    "is {} {} than {}", "Why is {} {} than {}?", "In general, is {} {} than {}?",
)  # fmt: skip
CONVERT = (
    "How do I convert {} to {}?", "Convert {} to {}.", "What's the way to turn {} into {}?",
    "{} to {} conversion?", "How can I change {} into {}?", "convert {} into {} please",
)  # fmt: skip
TRAVEL = (
    "How do I get from {} to {}?", "Best way to travel from {} to {}?",
    "Cheapest way to get from {} to {}?", "How long does it take to go from {} to {}?",
)  # fmt: skip
TRANSLATE = (
    "Translate '{}' into {}.", "How do you say '{}' in {}?", "What is '{}' in {}?",
    "'{}' in {}, please.", "How would I say '{}' in {}?",
)  # fmt: skip
FORMAT = (
    "Explain {} {}.", "Give me {} {}.", "Can you describe {} {}?", "Write about {} {}.",
    "Present {} {}.", "I need {} {}.",
)  # fmt: skip
OPERATE = (
    "How do I {} {}?", "What are the steps to {} {}?", "How can I {} {}?", "how to {} {}",
    "I need to {} {}. How?", "Walk me through how to {} {}.",
)  # fmt: skip
NEGATION = (
    ("Reasons to {}?", "Reasons not to {}?"), ("Why should I {}?", "Why shouldn't I {}?"),
    ("Is it a good idea to {}?", "Is it a bad idea to {}?"),
    ("What happens if I {}?", "What happens if I never {}?"),
    ("Should I {}?", "Should I avoid trying to {}?"),
)  # fmt: skip
NUMBER = (
    "Plan a {}-day trip to {}.", "Give me {} things to do in {}.", "What was {} like in {}?",
    "Suggest a {}-minute walking route in {}.", "Best hotels in {} under {} dollars?",
)  # fmt: skip


def _two(rng: random.Random, templates: tuple[str, ...]) -> tuple[str, str]:
    first, second = rng.sample(templates, 2)
    return first, second


def _noise(rng: random.Random, text: str) -> str:
    """Surface changes that never change the request: case, punctuation, a greeting."""
    r = rng.random()
    if r < 0.15:
        return text.lower().rstrip("?.")
    if r < 0.25:
        return "Hey, " + text[0].lower() + text[1:]
    if r < 0.35:
        return text.rstrip("?.") + ", please?" if text.endswith("?") else text + " Thanks!"
    return text


def paraphrases(rng: random.Random, part: str) -> Iterator[Example]:
    for task in v.split(v.HOWTO, part):
        for _ in range(6):
            t1, t2 = _two(rng, HOW)
            yield Example(t1.format(task), _noise(rng, t2.format(task)), 1, "paraphrase")
    for concept in v.split(v.CONCEPTS, part):
        for _ in range(5):
            t1, t2 = _two(rng, WHAT)
            yield Example(t1.format(concept), _noise(rng, t2.format(concept)), 1, "paraphrase")


def comparisons(rng: random.Random, part: str) -> Iterator[Example]:
    pairs = [p for group in v.COMPARABLES for p in v.split(group, "train")] if part == "train" \
        else [group[-1] for group in v.COMPARABLES]  # fmt: skip
    for (x, y), adj in itertools.product(pairs, v.split(v.ADJECTIVES, part)):
        if rng.random() < 0.45:
            t1, t2 = _two(rng, COMPARE)
            yield Example(t1.format(x, adj, y), t2.format(x, adj, y), 1, "comparison_same")
            yield Example(t1.format(x, adj, y), t2.format(y, adj, x), 0, "comparison_reversed")


def conversions(rng: random.Random, part: str) -> Iterator[Example]:
    for x, y in v.split(v.CONVERSIONS, part):
        for _ in range(4):
            t1, t2 = _two(rng, CONVERT)
            yield Example(t1.format(x, y), t2.format(x, y), 1, "direction_same")
            yield Example(t1.format(x, y), t2.format(y, x), 0, "direction_swapped")
    places = v.split(v.PLACES, part)
    for x, y in rng.sample(list(itertools.permutations(places, 2)), 3 * len(places)):
        t1, t2 = _two(rng, TRAVEL)
        yield Example(t1.format(x, y), t2.format(x, y), 1, "direction_same")
        yield Example(t1.format(x, y), t2.format(y, x), 0, "direction_swapped")


def languages(rng: random.Random, part: str) -> Iterator[Example]:
    langs = v.split(v.LANGUAGES, part)
    for phrase in v.split(v.PHRASES, part) if part == "tune" else v.PHRASES[:8]:
        for _ in range(4):
            x, y = rng.sample(langs, 2)
            t1, t2 = _two(rng, TRANSLATE)
            yield Example(t1.format(phrase, x), t2.format(phrase, x), 1, "language_same")
            yield Example(t1.format(phrase, x), t2.format(phrase, y), 0, "language")
    for concept in v.split(v.CONCEPTS, part):
        x, y = rng.sample(langs, 2)
        yield Example(f"Explain {concept} in {x}.", f"Explain {concept} in {y}.", 0, "language")


def formats(rng: random.Random, part: str) -> Iterator[Example]:
    for topic in v.split(v.FORMAT_TOPICS, part):
        for f1, f2 in rng.sample(v.split(v.FORMAT_PAIRS, part), 10 if part == "train" else 3):
            t1, t2 = _two(rng, FORMAT)
            f1, f2 = (f1, f2) if rng.random() < 0.5 else (f2, f1)
            yield Example(t1.format(topic, f1), t2.format(topic, f1), 1, "format_same")
            yield Example(t1.format(topic, f1), t2.format(topic, f2), 0, "output_format")


def operations(rng: random.Random, part: str) -> Iterator[Example]:
    ops = v.split(v.OPERATION_PAIRS, part)
    for obj in v.split(v.TASK_OBJECTS, part):
        for o1, o2 in rng.sample(ops, 8 if part == "train" else 3):
            o1, o2 = (o1, o2) if rng.random() < 0.5 else (o2, o1)
            t1, t2 = _two(rng, OPERATE)
            yield Example(t1.format(o1, obj), t2.format(o1, obj), 1, "operation_same")
            yield Example(t1.format(o1, obj), t2.format(o2, obj), 0, "different_operation")


def entities(rng: random.Random, part: str) -> Iterator[Example]:
    for template, names in v.ENTITY_TEMPLATES:
        for x, y in itertools.combinations(
            v.split(names, part) if part == "tune" else names[:6], 2
        ):
            yield Example(
                template.format(x), _noise(rng, template.format(y)), 0, "different_entity"
            )
    tasks = v.split(v.HOWTO, part)
    for task, other in zip(tasks, rng.sample(tasks, len(tasks)), strict=True):
        if task != other:
            t1, t2 = _two(rng, HOW)
            yield Example(t1.format(task), t2.format(other), 0, "different_entity")


def negations(rng: random.Random, part: str) -> Iterator[Example]:
    for task in v.split(v.HOWTO, part):
        for plain, negated in rng.sample(NEGATION, 4 if part == "train" else 1):
            yield Example(plain.format(task), negated.format(task), 0, "negation")


def numbers(rng: random.Random, part: str) -> Iterator[Example]:
    for place, template in itertools.product(v.split(v.PLACES, part), NUMBER):
        n, m = rng.sample([2, 3, 4, 5, 7, 10, 14, 20, 30, 45, 90, 150, 200, 1990, 2005], 2)
        args = (
            (n, place)
            if template.count("{}") == 2 and not template.startswith("Best")
            else (place, n)
        )
        other = (m, place) if args[0] == n else (place, m)
        yield Example(template.format(*args), template.format(*other), 0, "number")


def unrelated(rng: random.Random, part: str) -> Iterator[Example]:
    pool = [t.format(x) for x in v.split(v.HOWTO, part) for t in HOW[:3]]
    pool += [t.format(c) for c in v.split(v.CONCEPTS, part) for t in WHAT[:3]]
    for _ in range(len(pool) // 4):
        x, y = rng.sample(pool, 2)
        yield Example(x, y, 0, "unrelated")


GENERATORS: tuple[Callable[[random.Random, str], Iterator[Example]], ...] = (
    paraphrases,
    comparisons,
    conversions,
    languages,
    formats,
    operations,
    entities,
    negations,
    numbers,
    unrelated,
    *verifier_everyday.GENERATORS,
)


def _lines(path: Path, part: str) -> list[dict[str, object]]:
    """Lines 0, 4, 8, ... train; 2, 6, 10, ... tune; odd lines are never read."""
    offset = 0 if part == "train" else 2
    with path.open(encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for i, r in enumerate(rows) if i % 4 == offset]


def qqp(part: str) -> list[Example]:
    return [
        Example(str(r["a"]), str(r["b"]), int(bool(r["duplicate"])), "qqp")
        for r in _lines(QQP, part)
    ]


def _words(text: str) -> set[str]:
    return {w.strip(".,;:!?()'\"").lower() for w in text.split()} - {""}


def gptcache(part: str) -> list[Example]:
    """GPTCache's statement paraphrases (the benchmark scores only the odd lines), and per
    pair the source against the paraphrase of the source sharing most words with it."""
    rows = [(str(r["a"]), str(r["b"])) for r in _lines(GPTCACHE, part)]
    words = [_words(a) for a, _ in rows]
    out = [Example(a, b, 1, "gptcache") for a, b in rows]
    for i, (a, _) in enumerate(rows):
        overlap = [len(words[i] & w) / len(words[i] | w) if j != i else -1.0
                   for j, w in enumerate(words)]  # fmt: skip
        j = max(range(len(rows)), key=overlap.__getitem__)
        if rows[j][0] != a:
            out.append(Example(a, rows[j][1], 0, "gptcache_other"))
    return out


def build(part: str) -> list[Example]:
    rng = random.Random(f"{SEED}-{part}")
    generated = [e for gen in GENERATORS for e in gen(rng, part)]
    return generated + qqp(part) + gptcache(part)


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    built = {part: build(part) for part in ("train", "tune")}
    generated = [t for part in built.values() for e in part if e.category != "qqp"
                 for t in (e.a, e.b)]  # fmt: skip
    leak = verifier_leak.check(generated, HELD_OUT)  # raises on a repeated held-out sentence
    print("held-out check passed:", leak)
    for part, examples in built.items():
        with (out / f"{part}.jsonl").open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(asdict(e), ensure_ascii=False) + "\n" for e in examples)
        counts: dict[str, int] = {}
        for e in examples:
            counts[f"{e.category}:{e.label}"] = counts.get(f"{e.category}:{e.label}", 0) + 1
        print(part, len(examples), dict(sorted(counts.items())))


if __name__ == "__main__":
    main()
