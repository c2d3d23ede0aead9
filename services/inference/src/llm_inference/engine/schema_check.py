"""Which JSON Schema keywords xgrammar 0.2.9 enforces, and a walk that rejects the rest.

Constrained decoding must never produce output that fails the caller's schema, yet xgrammar
silently ignores some keywords. Found by experiment (tests/integration/engine/
test_grammar_compile.py keeps the evidence) and enforced as token masks:

- type (one or a list), enum, const, anyOf, allOf with one member, oneOf whose branches cannot
  overlap (distinct types, distinct const/enum values, or a required discriminator property with
  distinct const/enum values), local $ref ("#", "#/$defs/...", "#/definitions/..."), recursion;
- objects: properties (emitted in schema order), required (names declared in properties),
  additionalProperties, patternProperties, propertyNames, unevaluatedProperties,
  minProperties (up to the required count), maxProperties;
- arrays: items (a schema), prefixItems, unevaluatedItems, minItems, maxItems;
- strings: minLength, maxLength, pattern (matched against the whole string; refused when it
  can match a quote, backslash or control character literally, see regex_scan), format: date,
  time, date-time, ipv4, ipv6, uuid, email, uri, uri-reference (schema_rewrite restates
  lengths, patterns, date, time, date-time and ipv4 where xgrammar's own rules are wrong);
- numbers: minimum, maximum, exclusiveMinimum, exclusiveMaximum (numbers), multipleOf on
  integers.

Rejected (InvalidRequest naming keyword and JSON path): not, if/then/else, dependentSchemas,
dependentRequired, dependencies, contains/minContains/maxContains, uniqueItems: true,
additionalItems, items as an array, $dynamicRef/$recursiveRef/$anchor..., $ref to anything but
this document, $ref with validation siblings (ignored by xgrammar), $id below the root, other
formats (hostname, duration, ... are not fully enforced), multipleOf on non-integers,
minLength/maxLength or pattern together with format, lengths with pattern (xgrammar drops the
lengths), allOf with several members, overlapping oneOf, required names missing from
properties, minProperties above the required count (duplicate keys could fake it), patterns
xgrammar mis-enforces. Unknown keywords are annotations (JSON Schema ignores them) and pass.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from decimal import ROUND_CEILING, Decimal
from itertools import combinations
from typing import Any

from .api import InvalidRequest
from .regex_scan import only_matches, parts

MAX_SCHEMA_DEPTH = 32
MAX_REF_HOPS = 16
FORMATS = frozenset(
    ["date", "time", "date-time", "ipv4", "ipv6", "uuid", "email", "uri", "uri-reference"]
)
UNSUPPORTED = {
    "not": "xgrammar cannot enforce negation",
    "if": "conditionals are not enforced",
    "then": "conditionals are not enforced",
    "else": "conditionals are not enforced",
    "dependentSchemas": "not enforced",
    "dependentRequired": "not enforced",
    "dependencies": "not enforced",
    "contains": "not enforced",
    "minContains": "not enforced",
    "maxContains": "not enforced",
    "additionalItems": "use prefixItems and items",
    "$dynamicRef": "dynamic references are not supported",
    "$dynamicAnchor": "dynamic references are not supported",
    "$recursiveRef": "recursive references are not supported; use $ref",
    "$recursiveAnchor": "recursive references are not supported; use $ref",
    "$anchor": "anchors are not supported; use $ref to #/$defs/...",
}
# Keywords whose value is one subschema, a list of them, or a name -> subschema map.
ONE_KEYWORDS = (
    "additionalProperties",
    "items",
    "unevaluatedProperties",
    "unevaluatedItems",
    "propertyNames",
)
LIST_KEYWORDS = ("anyOf", "oneOf", "allOf", "prefixItems")
MAP_KEYWORDS = ("properties", "patternProperties", "$defs", "definitions")
# Siblings a $ref may have (xgrammar ignores every other keyword next to $ref).
_REF_SIBLINGS = frozenset(
    [
        "$ref",
        "$defs",
        "definitions",
        "$schema",
        "$id",
        "$comment",
        "title",
        "description",
        "default",
        "examples",
        "deprecated",
        "readOnly",
        "writeOnly",
    ]
)
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")
_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")
_PLAIN_KEY = re.compile(r"[A-Za-z_$][A-Za-z0-9_$-]*")
_UNSAFE = frozenset([*range(0x20), 0x22, 0x5C])  # quote, backslash, control characters


def check_schema(schema: Any, field: str) -> None:
    """Raise InvalidRequest (with `field`) at the first keyword xgrammar would not enforce."""
    _Walk(schema, field).node(schema, "$", 0)


class _Walk:
    def __init__(self, root: Any, field: str) -> None:
        self.root = root
        self.field = field

    def fail(self, keyword: str, path: str, why: str) -> InvalidRequest:
        return InvalidRequest(f'unsupported keyword "{keyword}" at {path}: {why}', self.field)

    def node(self, schema: Any, path: str, depth: int) -> None:
        if isinstance(schema, bool):
            return
        if not isinstance(schema, dict):
            raise InvalidRequest(f"schema at {path} must be an object or a boolean", self.field)
        if depth > MAX_SCHEMA_DEPTH:
            raise InvalidRequest(
                f"schema nests deeper than {MAX_SCHEMA_DEPTH} at {path}", self.field
            )
        self.keywords(schema, path, depth)
        self.children(schema, path, depth)

    def keywords(self, schema: dict[str, Any], path: str, depth: int) -> None:
        for keyword, why in UNSUPPORTED.items():
            if keyword in schema:
                raise self.fail(keyword, path, why)
        if "$id" in schema and depth > 0:
            raise self.fail("$id", path, "only the root may set $id")
        if schema.get("uniqueItems") is True:
            raise self.fail("uniqueItems", path, "not enforced")
        if isinstance(schema.get("items"), list):
            raise self.fail("items", path, "the array form is not supported; use prefixItems")
        self.numbers(schema, path)
        self.strings(schema, path)
        self.objects(schema, path)
        self.combinators(schema, path)
        if "$ref" in schema:
            self.ref(schema, path)

    def numbers(self, schema: dict[str, Any], path: str) -> None:
        for keyword in _COUNTS:
            value = schema.get(keyword)
            if keyword in schema and (type(value) is not int or value < 0):
                raise InvalidRequest(
                    f'"{keyword}" at {path} must be a non-negative integer', self.field
                )
        for keyword in _BOUNDS:
            value = schema.get(keyword)
            if keyword in schema and (isinstance(value, bool) or not _is_number(value)):
                raise InvalidRequest(f'"{keyword}" at {path} must be a number', self.field)
        if "multipleOf" in schema and (
            schema.get("type") != "integer" or type(schema["multipleOf"]) is not int
        ):
            raise self.fail("multipleOf", path, 'enforced only as an integer on "type": "integer"')
        if schema.get("type") != "integer" and not _holds_a_decimal(schema):
            # xgrammar writes numbers with at most 6 fraction digits: a range holding none
            # compiles to an empty rule, and the output would not be JSON.
            raise self.fail(
                "minimum", path, f"the range holds no number with at most {DECIMALS} decimals"
            )

    def strings(self, schema: dict[str, Any], path: str) -> None:
        fmt = schema.get("format")
        if "format" in schema and fmt not in FORMATS:
            raise self.fail("format", path, f"format {json.dumps(fmt)} is not enforced")
        if "pattern" in schema:
            self.pattern(schema["pattern"], "pattern", path)
        if isinstance(schema.get("patternProperties"), dict):
            for name in schema["patternProperties"]:
                self.pattern(name, "patternProperties", path)
        shape = [k for k in ("pattern", "format") if k in schema]
        if len(shape) == 2:
            raise self.fail("pattern", path, 'only one of "pattern" and "format" is enforced')
        lengths = [k for k in ("minLength", "maxLength") if k in schema]
        if lengths and shape:
            raise self.fail(lengths[0], path, f'xgrammar ignores it next to "{shape[0]}"')

    def pattern(self, pattern: Any, keyword: str, path: str) -> None:
        if not isinstance(pattern, str):
            raise InvalidRequest(f'"{keyword}" at {path} must hold strings', self.field)
        problem = pattern_problem(pattern)
        if problem is not None:
            raise self.fail(keyword, path, f"{json.dumps(pattern)}: {problem}")

    def objects(self, schema: dict[str, Any], path: str) -> None:
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(n, str) for n in required):
            raise InvalidRequest(f'"required" at {path} must be a list of names', self.field)
        declared = schema.get("properties", {})
        missing = [n for n in required if not isinstance(declared, dict) or n not in declared]
        if missing:
            why = f"{json.dumps(missing[0])} is not declared in properties (not enforced)"
            raise self.fail("required", path, why)
        floor = schema.get("minProperties", 0)
        if isinstance(floor, int) and floor > len(set(required)):
            raise self.fail("minProperties", path, "enforced only up to the required count")

    def combinators(self, schema: dict[str, Any], path: str) -> None:
        for keyword in LIST_KEYWORDS:
            if keyword in schema and (not isinstance(schema[keyword], list) or not schema[keyword]):
                raise InvalidRequest(f'"{keyword}" at {path} must be a non-empty list', self.field)
        if len(schema.get("allOf", ())) > 1:
            raise self.fail("allOf", path, "only one member is enforced")
        if "oneOf" in schema and not self.disjoint(schema["oneOf"]):
            raise self.fail("oneOf", path, "branches may overlap (enforced as anyOf); use anyOf")

    def ref(self, schema: dict[str, Any], path: str) -> None:
        ref = schema["$ref"]
        if not isinstance(ref, str) or not (ref == "#" or ref.startswith("#/")):
            raise self.fail("$ref", path, f"only references into this schema (#/...), not {ref!r}")
        self.resolve(ref, path)
        siblings = sorted(set(schema) - _REF_SIBLINGS)
        if siblings:
            raise self.fail(siblings[0], path, 'ignored next to "$ref"; wrap it in allOf instead')

    def children(self, schema: dict[str, Any], path: str, depth: int) -> None:
        for keyword in ONE_KEYWORDS:
            if keyword in schema:
                self.node(schema[keyword], f"{path}.{keyword}", depth + 1)
        for keyword in LIST_KEYWORDS:
            for i, sub in enumerate(schema.get(keyword, ())):
                self.node(sub, f"{path}.{keyword}[{i}]", depth + 1)
        for keyword in MAP_KEYWORDS:
            subs = schema.get(keyword, {})
            if not isinstance(subs, dict):
                raise InvalidRequest(f'"{keyword}" at {path} must be an object', self.field)
            for name, sub in subs.items():
                self.node(sub, f"{path}.{keyword}{_key(name)}", depth + 1)

    def resolve(self, ref: str, path: str) -> Any:
        """The subschema a local JSON pointer names; InvalidRequest when it names nothing."""
        target: Any = self.root
        for part in ref[2:].split("/") if ref != "#" else ():
            name = part.replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and name in target:
                target = target[name]
            elif isinstance(target, list) and name.isdigit() and int(name) < len(target):
                target = target[int(name)]
            else:
                raise InvalidRequest(f"$ref {ref!r} at {path} names nothing", self.field)
        return target

    def follow(self, schema: Any) -> Any:
        """`schema` with local $refs followed (bounded: refs may loop)."""
        for _ in range(MAX_REF_HOPS):
            ref = schema.get("$ref") if isinstance(schema, dict) else None
            if not isinstance(ref, str) or not ref.startswith("#"):
                return schema
            schema = self.resolve(ref, "$")
        return schema

    def disjoint(self, branches: Sequence[Any]) -> bool:
        """Whether no JSON value can match two of the oneOf branches."""
        resolved = [self.follow(b) for b in branches]
        if not all(isinstance(b, dict) for b in resolved):
            return False
        # Every pair apart, each by any criterion (null vs objects by type, objects by a const).
        return all(self.separated(a, b) for a, b in combinations(resolved, 2))

    def separated(self, a: dict[str, Any], b: dict[str, Any]) -> bool:
        """Whether no JSON value matches both branches (by type, value or discriminator)."""
        return (
            _pairwise_disjoint([_types(a), _types(b)])
            or _pairwise_disjoint([_values(a), _values(b)])
            or self.discriminated([a, b])
        )

    def discriminated(self, branches: Sequence[dict[str, Any]]) -> bool:
        """Objects sharing a required property whose const/enum values differ per branch."""
        shared = set.intersection(*(set(b.get("required", ())) for b in branches))
        for name in sorted(shared):
            props = [b.get("properties", {}) for b in branches]
            if all(isinstance(p, dict) for p in props) and _pairwise_disjoint(
                [_values(self.follow(p.get(name))) for p in props]
            ):
                return True
        return False


def _types(schema: Mapping[str, Any]) -> set[str] | None:
    """The JSON types a schema allows when it says ("integer" counts as a number)."""
    given = schema.get("type")
    names = [given] if isinstance(given, str) else given
    if not isinstance(names, list) or not names:
        return None
    return {"number" if n == "integer" else str(n) for n in names}


def _values(schema: Any) -> set[str] | None:
    """The canonical JSON texts of a schema's const/enum values, when it lists them."""
    if not isinstance(schema, dict):
        return None
    if "const" in schema:
        return {json.dumps(schema["const"], sort_keys=True)}
    if isinstance(schema.get("enum"), list):
        return {json.dumps(v, sort_keys=True) for v in schema["enum"]}
    return None


def _pairwise_disjoint(sets: Sequence[set[str] | None]) -> bool:
    if any(s is None for s in sets):
        return False
    return all(not (a & b) for a, b in combinations([s for s in sets if s is not None], 2))


def pattern_problem(pattern: str) -> str | None:
    """Why xgrammar would emit invalid JSON for `pattern`, or None (see regex_scan)."""
    if any(
        part.kind in ("atom", "class") and only_matches(part, _UNSAFE) for part in parts(pattern)
    ):
        return "it can match a quote, backslash or control character literally (emitted unescaped)"
    return None


DECIMALS = 6


def _holds_a_decimal(schema: Mapping[str, Any]) -> bool:
    """Whether the bounds admit a number with at most DECIMALS fraction digits."""
    low = schema.get("exclusiveMinimum", schema.get("minimum"))
    high = schema.get("exclusiveMaximum", schema.get("maximum"))
    if not (_is_number(low) and _is_number(high)):
        return True  # a half-open range always holds one
    step = Decimal(1).scaleb(-DECIMALS)
    first = (Decimal(repr(low)) / step).to_integral_value(rounding=ROUND_CEILING) * step
    if "exclusiveMinimum" in schema and first == Decimal(repr(low)):
        first += step
    top = Decimal(repr(high))
    return first < top if "exclusiveMaximum" in schema else first <= top


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float)


def _key(name: str) -> str:
    return f".{name}" if _PLAIN_KEY.fullmatch(name) else f"[{json.dumps(name)}]"
