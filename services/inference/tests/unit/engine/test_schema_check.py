"""schema_check: keywords xgrammar would not enforce are rejected with their JSON path."""

from __future__ import annotations

from typing import Any

import pytest

from llm_inference.engine.api import InvalidRequest
from llm_inference.engine.schema_check import MAX_SCHEMA_DEPTH, check_schema, pattern_problem

FIELD = "sampling.format.json_schema"


def _rejected(schema: Any) -> str:
    with pytest.raises(InvalidRequest) as caught:
        check_schema(schema, FIELD)
    assert caught.value.field == FIELD
    return str(caught.value)


@pytest.mark.parametrize(
    "schema",
    [
        True,
        {},
        {"type": ["integer", "null"], "minimum": 0, "maximum": 9},
        {"enum": ["a", 1, None]},
        {"anyOf": [{"type": "string", "maxLength": 3}, {"type": "integer"}]},
        {"allOf": [{"type": "integer"}]},
        {"oneOf": [{"type": "string"}, {"type": "integer"}]},
        {"oneOf": [{"const": "a"}, {"enum": ["b", "c"]}]},
        {
            "$defs": {
                "cat": {
                    "type": "object",
                    "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
                    "required": ["kind"],
                },
                "dog": {
                    "type": "object",
                    "properties": {"kind": {"const": "dog"}},
                    "required": ["kind"],
                },
            },
            "oneOf": [{"$ref": "#/$defs/cat"}, {"$ref": "#/$defs/dog"}],
        },
        {
            "type": "object",
            "properties": {"a b": {"type": "string", "format": "email", "description": "x"}},
            "required": ["a b"],
            "additionalProperties": False,
            "x-vendor": {"not": "an annotation, ignored"},
        },
        {"type": "array", "prefixItems": [{"type": "integer"}], "items": False, "maxItems": 1},
        {"$defs": {"t": {"type": "object", "properties": {"c": {"$ref": "#/$defs/t"}}}}},
        {"$ref": "#/definitions/n", "definitions": {"n": {"type": "integer"}}, "title": "n"},
        {"type": "integer", "multipleOf": 3},
        {"type": "string", "pattern": "^[a-z]+$"},
        {"type": "object", "properties": {"not": {"type": "string"}}, "required": ["not"]},
        {"type": "object", "minProperties": 1, "properties": {"a": {}}, "required": ["a"]},
    ],
)
def test_enforced_schemas_pass(schema: Any) -> None:
    check_schema(schema, FIELD)


@pytest.mark.parametrize(
    ("schema", "keyword", "path"),
    [
        ({"properties": {"a": {"not": {"type": "string"}}}}, "not", "$.properties.a"),
        ({"if": {"type": "integer"}, "then": {"minimum": 1}}, "if", "$"),
        ({"items": {"dependentSchemas": {"a": {}}}}, "dependentSchemas", "$.items"),
        ({"anyOf": [{}, {"dependentRequired": {"a": ["b"]}}]}, "dependentRequired", "$.anyOf[1]"),
        ({"type": "array", "contains": {"const": 1}}, "contains", "$"),
        ({"type": "array", "uniqueItems": True}, "uniqueItems", "$"),
        ({"type": "array", "items": [{"type": "integer"}]}, "items", "$"),
        ({"type": "string", "format": "iri"}, "format", "$"),
        ({"$defs": {"x": {"format": "bogus"}}}, "format", "$.$defs.x"),
        ({"$ref": "https://example.com/s.json"}, "$ref", "$"),
        ({"$defs": {"n": {}}, "$ref": "#/$defs/n", "minimum": 3}, "minimum", "$"),
        ({"type": "number", "multipleOf": 0.5}, "multipleOf", "$"),
        ({"type": "string", "pattern": "a+", "maxLength": 3}, "maxLength", "$"),
        ({"type": "string", "format": "date", "minLength": 3}, "minLength", "$"),
        ({"allOf": [{"type": "integer"}, {"minimum": 1}]}, "allOf", "$"),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, "oneOf", "$"),
        ({"oneOf": [{"type": "object"}, {"type": "object"}]}, "oneOf", "$"),
        ({"properties": {"a": {}}, "required": ["b"]}, "required", "$"),
        ({"properties": {"a": {}}, "minProperties": 2}, "minProperties", "$"),
        ({"properties": {"q": {"$id": "q"}}}, "$id", "$.properties.q"),
        ({"$anchor": "x"}, "$anchor", "$"),
        ({"type": "string", "format": "date", "pattern": "^2"}, "pattern", "$"),
        ({"type": "string", "format": "hostname"}, "format", "$"),
        ({"properties": {"a": {"pattern": '^"$'}}}, "pattern", "$.properties.a"),
        ({"patternProperties": {"\\n": {}}}, "patternProperties", "$"),
    ],
)
def test_unenforced_keywords_are_named_with_their_path(
    schema: Any, keyword: str, path: str
) -> None:
    assert _rejected(schema).startswith(f'unsupported keyword "{keyword}" at {path}:')


def test_odd_property_names_are_quoted_in_paths() -> None:
    message = _rejected({"properties": {"a.b": {"not": {}}}})
    assert message.startswith('unsupported keyword "not" at $.properties["a.b"]')


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "integer", "minimum": True}, '"minimum" at $ must be a number'),
        ({"type": "string", "maxLength": -1}, '"maxLength" at $ must be a non-negative integer'),
        ({"anyOf": []}, '"anyOf" at $ must be a non-empty list'),
        ({"properties": []}, '"properties" at $ must be an object'),
        ({"items": 3}, "schema at $.items must be an object or a boolean"),
        ({"$ref": "#/$defs/missing"}, "$ref '#/$defs/missing' at $ names nothing"),
        ({"required": "a"}, '"required" at $ must be a list of names'),
    ],
)
def test_malformed_keywords_are_explained(schema: Any, expected: str) -> None:
    assert _rejected(schema) == expected


def test_nesting_is_bounded() -> None:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(MAX_SCHEMA_DEPTH + 1):
        schema = {"type": "array", "items": schema}
    assert "nests deeper than" in _rejected(schema)


def test_looping_refs_in_one_of_terminate() -> None:
    schema = {"$defs": {"a": {"$ref": "#/$defs/a"}}, "oneOf": [{"$ref": "#/$defs/a"}, {}]}
    assert _rejected(schema).startswith('unsupported keyword "oneOf" at $:')


@pytest.mark.parametrize(
    ("pattern", "safe"),
    [
        ("^[a-z]+$", True),
        ("^\\d{3}-\\w+\\.\\s?$", True),
        ('^[^"\\\\\\x00-\\x1f]{2}$', True),  # xgrammar filters classes...
        ("^[\\x20-\\x7e]+$", True),
        ('^[a"]$', True),
        ("^\\x20\\u00e9.*$", True),
        ('^a"b$', False),  # ...but not literals
        ('^["]$', False),  # ...nor classes of nothing else
        ("^[\\x00-\\x1f]$", False),
        ("^\\\\$", False),  # an escaped backslash
        ("^\\x22$", False),
        ("^\\u005C$", False),
        ("^a\\nb$", False),
        ("^\\t$", False),
        ("^\x01$", False),
    ],
)
def test_patterns_that_could_emit_raw_characters(pattern: str, safe: bool) -> None:
    assert (pattern_problem(pattern) is None) is safe


def test_one_of_branches_may_be_told_apart_by_different_criteria() -> None:
    # GeoJSON's nullable geometry: null apart by type, the two objects by their "type" const.
    point = {
        "type": "object",
        "properties": {"type": {"const": "Point"}},
        "required": ["type"],
    }
    line = {
        "type": "object",
        "properties": {"type": {"const": "LineString"}},
        "required": ["type"],
    }
    check_schema({"oneOf": [{"type": "null"}, point, line]}, "f")
    with pytest.raises(InvalidRequest, match="oneOf"):
        check_schema({"oneOf": [{"type": "null"}, point, {"type": "object"}]}, "f")


@pytest.mark.parametrize(
    ("bounds", "holds"),
    [
        ({"minimum": 0.1, "maximum": 0.1}, True),
        ({"minimum": 0, "maximum": 1e-7}, True),
        ({"exclusiveMinimum": 0, "exclusiveMaximum": 1e-6}, False),
        ({"minimum": 1.0000001, "maximum": 1.0000009}, False),
    ],
)
def test_number_ranges_must_hold_a_six_decimal_number(
    bounds: dict[str, float], holds: bool
) -> None:
    schema = {"type": "number", **bounds}
    if holds:
        check_schema(schema, "f")
    else:
        with pytest.raises(InvalidRequest, match="6 decimals"):
            check_schema(schema, "f")
