"""Everyday request families for the verifier's data: the same request in many wordings
(questions and imperatives: write, explain, list, summarize, compare, convert, code, cook,
travel, fix; with greetings, politeness, contractions and typos) and, built from the same
wordings, the near-misses that must not share an answer (output format, language,
programming language, entity, operation, direction, comparison order, number, added detail).

Both sides of a near-miss are worded differently too, so wording alone never tells the
label. Slot values: verifier_everyday_vocab (split train/tune by verifier_vocab.split).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterator, Sequence

import verifier_everyday_vocab as w
from verifier_types import Example
from verifier_vocab import split

_CONTRACTIONS = (
    ("What is", "What's"), ("what is", "what's"), ("do not", "don't"), ("I would", "I'd"),
    ("I am", "I'm"), ("How is", "How's"), ("cannot", "can't"), ("It is", "It's"),
)  # fmt: skip
_IMPERATIVE_EXPLAIN = tuple(
    t for t in w.EXPLAIN if t.split()[0] in ("Explain", "Help", "Break", "Walk", "explain")
)


def noise(rng: random.Random, text: str) -> str:
    """Surface changes that never change the request: a wrapper (greeting, thanks),
    contractions either way, lower case without the final mark, or one typo."""
    r = rng.random()
    if r < 0.25:
        text = rng.choice(w.OPEN_ENDED).format(text[0].lower() + text[1:] if r < 0.1 else text)
    elif r < 0.4:
        long, short = rng.choice(_CONTRACTIONS)
        text = text.replace(long, short) if long in text else text.replace(short, long)
    elif r < 0.5:
        text = text.lower().rstrip("?.!")
    elif r < 0.65:
        text = typo(rng, text)
    return text


def typo(rng: random.Random, text: str) -> str:
    """Two neighbouring letters swapped, or one dropped, in one longer word."""
    words = [m for m in re.finditer(r"[A-Za-z]{5,}", text)]
    if not words:
        return text
    m = rng.choice(words)
    word, i = m.group(), rng.randrange(1, len(m.group()) - 2)
    changed = word[:i] + word[i + 1] + word[i] + word[i + 2 :] if rng.random() < 0.5 \
        else word[:i] + word[i + 1 :]  # fmt: skip
    return text[: m.start()] + changed + text[m.end() :]


def _two(rng: random.Random, templates: Sequence[str]) -> tuple[str, str]:
    a, b = rng.sample(list(templates), 2)
    return a, b


def _other(rng: random.Random, values: Sequence[str], value: str) -> str:
    return rng.choice([v for v in values if v != value])


def _family(
    rng: random.Random,
    templates: Sequence[str],
    objects: Sequence[str],
    *,
    same: int,
    entity: int,
) -> Iterator[Example]:
    """Per object: `same` pairs of two wordings, and `entity` pairs of two wordings over
    another object of the same list."""
    for obj in objects:
        for _ in range(same):
            t1, t2 = _two(rng, templates)
            yield Example(t1.format(obj), noise(rng, t2.format(obj)), 1, "everyday_same")
        for _ in range(entity):
            t1, t2 = _two(rng, templates)
            other = _other(rng, objects, obj)
            yield Example(t1.format(obj), noise(rng, t2.format(other)), 0, "different_entity")


def _styled(
    rng: random.Random,
    templates: Sequence[str],
    objects: Sequence[str],
    styles: Sequence[str],
    category: str,
) -> Iterator[Example]:
    """The same request with one style (format, audience, language) on both sides, and
    with two different styles."""
    for obj in objects:
        s1, s2 = rng.sample(list(styles), 2)
        t1, t2 = _two(rng, templates)
        a = t1.format(f"{obj} {s1}")
        yield Example(a, noise(rng, t2.format(f"{obj} {s1}")), 1, "everyday_same")
        yield Example(a, noise(rng, t2.format(f"{obj} {s2}")), 0, category)


def requests(rng: random.Random, part: str) -> Iterator[Example]:
    """Write / explain / list / summarize / recipes / cities / fixes: wordings, entities,
    output formats and languages."""
    langs = split(w.HUMAN_LANGUAGES, part)
    formats = split(w.FORMATS, part)
    kinds: tuple[tuple[Sequence[str], Sequence[str]], ...] = (
        (w.WRITE, split(w.WRITE_OBJECTS, part)),
        (w.EXPLAIN, split(w.EXPLAIN_OBJECTS, part)),
        (w.LIST, split(w.LIST_OBJECTS, part)),
        (w.SUMMARIZE, split(w.SUMMARY_OBJECTS, part)),
        (w.RECIPE, split(w.DISHES, part)),
        (w.CITY, split(w.CITIES, part)),
        (w.FIX, split(w.PROBLEMS, part)),
    )
    for templates, objects in kinds:
        yield from _family(rng, templates, objects, same=5, entity=2)
    for templates, objects in (
        (w.WRITE, split(w.WRITE_OBJECTS, part)),
        (_IMPERATIVE_EXPLAIN, split(w.EXPLAIN_OBJECTS, part)),
        (w.SUMMARIZE[:1] + w.SUMMARIZE[6:8], split(w.SUMMARY_OBJECTS, part)),
    ):
        for _ in range(2):
            yield from _styled(rng, templates, objects, formats, "output_format")
        yield from _styled(rng, templates, objects, [f"in {x}" for x in langs], "language")


def counted(rng: random.Random, part: str) -> Iterator[Example]:
    """ "Give me 5 X" against "List 5 X" (same) and "List 10 X" (number)."""
    counts = w.COUNTS
    for obj in split(w.LIST_OBJECTS, part):
        for _ in range(2):
            n, m = rng.sample(counts, 2)
            t1, t2 = _two(rng, w.LIST_N)
            yield Example(t1.format(n, obj), noise(rng, t2.format(n, obj)), 1, "everyday_same")
            yield Example(t1.format(n, obj), noise(rng, t2.format(m, obj)), 0, "number")


def conversions(rng: random.Random, part: str) -> Iterator[Example]:
    """Unit conversions with an amount: same; direction swapped; another amount; another
    unit."""
    units = split(w.UNIT_PAIRS, part)
    for a, b in units:
        for _ in range(4):
            x, y = rng.sample(w.AMOUNTS, 2)
            a, b = (a, b) if rng.random() < 0.5 else (b, a)
            t1, t2 = _two(rng, w.CONVERT_N)
            first = t1.format(x, a, b)
            yield Example(first, noise(rng, t2.format(x, a, b)), 1, "everyday_same")
            yield Example(first, noise(rng, t2.format(x, b, a)), 0, "direction_swapped")
            yield Example(first, noise(rng, t2.format(y, a, b)), 0, "number")
        c, d = rng.choice([u for u in units if u != (a, b)])
        t1, t2 = _two(rng, w.CONVERT_N)
        yield Example(t1.format("10", a, b), t2.format("10", c, d), 0, "different_entity")


def comparisons(rng: random.Random, part: str) -> Iterator[Example]:
    """ "Difference between X and Y" is the same request in either order; "is X better than
    Y" is not."""
    for x, y in split(w.SYMMETRIC_PAIRS, part):
        for _ in range(3):
            t1, t2 = _two(rng, w.COMPARE_SYM)
            p, q = (x, y) if rng.random() < 0.5 else (y, x)
            yield Example(t1.format(x, y), noise(rng, t2.format(p, q)), 1, "everyday_same")
        t1, t2 = _two(rng, w.PREFER)
        yield Example(t1.format(x, y), noise(rng, t1.format(y, x)), 0, "comparison_reversed")
        yield Example(t1.format(x, y), noise(rng, t2.format(y, x)), 0, "comparison_reversed")
        yield Example(t1.format(x, y), noise(rng, t2.format(x, y)), 1, "everyday_same")
        t1 = rng.choice(w.COMPARE_SYM)
        yield Example(t1.format(x, y), rng.choice(w.PREFER).format(x, y), 0, "different_operation")


def code(rng: random.Random, part: str) -> Iterator[Example]:
    """Programming questions: same task and language; another language; another task; another
    operation on the same object."""
    langs, tasks = split(w.PROGRAMMING, part), split(w.CODE_TASKS, part)
    for task in tasks:
        for _ in range(3):
            lang = rng.choice(langs)
            t1, t2 = _two(rng, w.CODE)
            first = t1.format(lang, task)
            yield Example(first, noise(rng, t2.format(lang, task)), 1, "everyday_same")
            other = _other(rng, langs, lang)
            yield Example(first, noise(rng, t2.format(other, task)), 0, "language")
        lang = rng.choice(langs)
        t1, t2 = _two(rng, w.CODE)
        yield Example(t1.format(lang, task), t2.format(lang, _other(rng, tasks, task)), 0,
                      "different_operation")  # fmt: skip
    for ops, obj in split(w.CODE_OPS, part) if part == "tune" else w.CODE_OPS[:9]:
        for _ in range(2):
            lang = rng.choice(langs)
            o1, o2 = rng.sample(ops, 2)
            t1, t2 = _two(rng, w.CODE)
            first = t1.format(lang, f"{o1} {obj}")
            yield Example(first, noise(rng, t2.format(lang, f"{o1} {obj}")), 1, "everyday_same")
            yield Example(first, noise(rng, t2.format(lang, f"{o2} {obj}")), 0,
                          "different_operation")  # fmt: skip


def dishes(rng: random.Random, part: str) -> Iterator[Example]:
    """A dish against the same dish with a change (vegan, without eggs, ...)."""
    for dish in split(w.DISHES, part):
        plain, changed = rng.choice(w.DISH_VARIANTS)
        t1, t2 = _two(rng, w.RECIPE)
        category = "negation" if "without" in changed and "with " in plain else "added_detail"
        yield Example(t1.format(plain.format(dish)), noise(rng, t2.format(changed.format(dish))),
                      0, category)  # fmt: skip


GENERATORS: tuple[Callable[[random.Random, str], Iterator[Example]], ...] = (
    requests,
    counted,
    conversions,
    comparisons,
    code,
    dishes,
)
