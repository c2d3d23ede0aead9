"""schema_rewrite: lengths and the date/time/ipv4 formats become patterns; nothing else moves."""

from __future__ import annotations

import re

import pytest

from llm_inference.engine.schema_rewrite import FORMAT_PATTERNS, enforceable, exact_groups


def test_lengths_become_a_pattern_of_plain_characters() -> None:
    rewritten = enforceable({"type": "string", "minLength": 2, "maxLength": 5, "title": "t"})
    assert rewritten == {"type": "string", "title": "t", "pattern": rewritten["pattern"]}
    pattern = re.compile(rewritten["pattern"])
    assert pattern.fullmatch("abc")
    assert pattern.fullmatch("üüüüü")
    assert not pattern.fullmatch("a")
    assert not pattern.fullmatch("abcdef")
    assert not pattern.fullmatch('a"b')
    assert not pattern.fullmatch("a\\b")
    assert not pattern.fullmatch("a\x01")
    assert re.compile(enforceable({"maxLength": 1})["pattern"]).fullmatch("")
    assert re.compile(enforceable({"minLength": 1})["pattern"]).fullmatch("x" * 100)


def test_formats_become_patterns() -> None:
    for fmt, pattern in FORMAT_PATTERNS.items():
        assert enforceable({"type": "string", "format": fmt}) == {
            "type": "string",
            "pattern": exact_groups(pattern),
        }
    assert enforceable({"format": "uuid"}) == {"format": "uuid"}


def test_every_subschema_is_rewritten_but_not_values() -> None:
    short = {"type": "string", "maxLength": 2}
    schema = {
        "properties": {"maxLength": short},
        "items": short,
        "anyOf": [short, {"type": "null"}],
        "$defs": {"d": {"format": "date"}},
        "additionalProperties": short,
        "enum": [{"maxLength": 3}],
        "const": {"format": "date"},
        "default": {"minLength": 1},
    }
    rewritten = enforceable(schema)
    for sub in (
        rewritten["properties"]["maxLength"],
        rewritten["items"],
        rewritten["anyOf"][0],
        rewritten["additionalProperties"],
    ):
        assert set(sub) == {"type", "pattern"}
    assert set(rewritten["$defs"]["d"]) == {"pattern"}
    for keyword in ("enum", "const", "default"):
        assert rewritten[keyword] == schema[keyword]
    assert schema["items"] == short  # the input is not changed


@pytest.mark.parametrize(
    ("pattern", "rewritten"),
    [
        ("^(?:ab+)?$", "^(?:|ab+)$"),
        ("^-?\\d+(\\.\\d+)?$", "^-?\\d+(|\\.\\d+)$"),
        ("^((ab+)?c)??$", "^(|(|ab+)c)$"),
        ("^(?P<x>a)?$", "^(?P<x>|a)$"),
        ("^\\(a\\)?[(]?[)]?$", "^\\(a\\)?[(]?[)]?$"),  # escaped and class parentheses
        ("^(ab)+(c)*(d){0,1}$", "^(ab)+(c)*(d){0,1}$"),
    ],
)
def test_optional_groups_become_alternations(pattern: str, rewritten: str) -> None:
    assert exact_groups(pattern) == rewritten
    assert enforceable({"patternProperties": {pattern: {}}}) == {
        "patternProperties": {rewritten: {}}
    }
    for text in ("", "ab", "abbc", "12", "-1.5", "(a)", "c"):
        assert bool(re.fullmatch(pattern, text)) == bool(re.fullmatch(rewritten, text))
