"""A small scanner for JSON Schema `pattern` regexes: just enough structure (groups,
quantifiers, classes, the characters an atom can match) to spot and repair what xgrammar
0.2.9 gets wrong when it enforces a pattern on a JSON string.

Found by comparing its masks with Python's `re` on every string up to five characters:
- a literal quote, backslash or control character is copied into the JSON text unescaped, so
  the output is not JSON ("." and classes are filtered, unless nothing else is left in them);
- an optional group "(...)?" holding a sequence with a repeat loses its other elements:
  "(?:ab+)?" also matches "bb". The same group written "(?:|...)" is enforced exactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

_QUANTIFIER = re.compile(r"(?:[*+?]|\{\d+(?:,\d*)?\})\??")
_GROUP_OPEN = re.compile(r"\((?:\?(?::|P?<[A-Za-z_][A-Za-z0-9_]*>))?")
_CONTROL_ESCAPES = "nrtfv0ae"


@dataclass(frozen=True, slots=True)
class Part:
    """One element of a pattern: "open" (a group's opening, prefix included), "close",
    "quant", "class" ([...]) or "atom" (a character or escape)."""

    kind: str
    start: int
    end: int
    # Code point ranges the part matches (atoms and classes; empty for \d, \w, ... and anchors).
    ranges: tuple[tuple[int, int], ...] = ()
    negated: bool = False
    shorthand: bool = False  # a class holding \d, \w, ...: it always has harmless members


def parts(pattern: str) -> Iterator[Part]:
    """The pattern's parts, left to right."""
    i = 0
    while i < len(pattern):
        char = pattern[i]
        if char == "[":
            part = _class(pattern, i)
        elif char == "(":
            opening = _GROUP_OPEN.match(pattern, i)
            part = Part("open", i, opening.end() if opening else i + 1)
        elif char == ")":
            part = Part("close", i, i + 1)
        elif quantifier := _QUANTIFIER.match(pattern, i):
            part = Part("quant", i, quantifier.end())
        else:
            code, end = _atom(pattern, i)
            part = Part("atom", i, end, () if code is None else ((code, code),))
        yield part
        i = part.end


def only_matches(part: Part, codes: frozenset[int]) -> bool:
    """Whether an atom or class matches nothing but `codes` (what xgrammar leaves unfiltered)."""
    if not part.ranges or part.negated or part.shorthand:
        return False
    return all(
        high - low < len(codes) and set(range(low, high + 1)) <= codes for low, high in part.ranges
    )


def _class(pattern: str, start: int) -> Part:
    i = start + 1
    negated = pattern.startswith("^", i)
    i += negated
    ranges: list[tuple[int, int]] = []
    shorthand = False
    first = True
    while i < len(pattern) and (pattern[i] != "]" or first):
        low, i = _atom(pattern, i)
        high = low
        if pattern.startswith("-", i) and i + 1 < len(pattern) and pattern[i + 1] != "]":
            high, i = _atom(pattern, i + 1)
        if low is not None and high is not None:
            ranges.append((low, high))
        shorthand |= low is None
        first = False
    return Part("class", start, min(i + 1, len(pattern)), tuple(ranges), negated, shorthand)


def _atom(pattern: str, i: int) -> tuple[int | None, int]:
    """The code point of the character or escape at pattern[i] (None for a shorthand class or
    an anchor) and the index after it."""
    if pattern[i] != "\\":
        return ord(pattern[i]), i + 1
    if i + 1 >= len(pattern):
        return None, i + 1
    char = pattern[i + 1]
    width = {"x": 2, "u": 4}.get(char)
    if width is not None:
        digits = pattern[i + 2 : i + 2 + width]
        code = int(digits, 16) if re.fullmatch(r"[0-9A-Fa-f]+", digits) else None
        return code, i + 2 + width
    if char in _CONTROL_ESCAPES:
        return 0x0A, i + 2  # some control character
    if char == "c":
        return 0x01, i + 3
    return (None if char.isalnum() else ord(char)), i + 2
