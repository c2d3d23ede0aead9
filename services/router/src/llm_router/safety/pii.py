"""Personal data detectors (e-mail addresses, Luhn-valid card numbers) and their redaction."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

EMAIL = "email"
CARD = "card"
KINDS = (EMAIL, CARD)

_EMAIL = re.compile(
    r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9-]{1,63}(?:\.[A-Za-z0-9-]{1,63})*"
    r"\.[A-Za-z]{2,24}(?![A-Za-z0-9-])"
)
# 13-19 digits, optionally grouped by single spaces or dashes (4111 1111 1111 1111).
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d])")
_PATTERNS = {EMAIL: _EMAIL, CARD: _CARD}
REPLACEMENTS = {EMAIL: "[EMAIL]", CARD: "[CARD]"}
# The longest text one finding can span (an address is at most 254 characters).
MAX_FINDING_CHARS = 256


@dataclass(frozen=True, slots=True)
class Finding:
    """One piece of personal data at text[start:end]."""

    kind: str
    start: int
    end: int


def luhn_valid(digits: str) -> bool:
    """The Luhn checksum every payment card number satisfies."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def find(text: str, kinds: Iterable[str]) -> list[Finding]:
    """Every finding of `kinds` in `text`, by position, overlaps removed (first wins)."""
    found = sorted(
        (f for kind in kinds for f in _find_kind(text, kind)), key=lambda f: (f.start, -f.end)
    )
    result: list[Finding] = []
    for finding in found:
        if not result or finding.start >= result[-1].end:
            result.append(finding)
    return result


def _find_kind(text: str, kind: str) -> Iterator[Finding]:
    for match in _PATTERNS[kind].finditer(text):
        if kind == CARD and not luhn_valid(re.sub(r"[ -]", "", match.group())):
            continue
        yield Finding(kind, match.start(), match.end())


def redact(text: str, kinds: Iterable[str]) -> tuple[str, tuple[str, ...]]:
    """`text` with every finding replaced by its placeholder, and the kinds replaced."""
    findings = find(text, kinds)
    if not findings:
        return text, ()
    parts: list[str] = []
    position = 0
    for f in findings:
        parts.append(text[position : f.start])
        parts.append(REPLACEMENTS[f.kind])
        position = f.end
    parts.append(text[position:])
    return "".join(parts), tuple(dict.fromkeys(f.kind for f in findings))
