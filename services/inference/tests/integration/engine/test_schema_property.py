"""Property: whatever JSON schema the engine accepts, every output that ends with STOP parses as
JSON and validates against it.

A few hundred schemas are drawn, deterministically, as instances of a restricted meta-schema
(META below: objects of strings with lengths, enums or formats, bounded integers and numbers,
booleans, bounded arrays, nested objects, required lists, anyOf of two; at most four levels),
plus every schema of bench/data/schemas/index.json (real-world shapes) that the engine
accepts. All of them run as one batch through EngineCore on the demo checkpoint (random
weights), temperature 1 with a seed each; the counts and the share that finished within
max_tokens are printed (pytest -s) and recorded with record_property.

Leaf schemas are drawn by hypothesis-jsonschema from their meta-schema (through _Many, an
adapter for the Hypothesis internals it relies on); the object levels are composed with plain
Hypothesis strategies (hypothesis-jsonschema re-canonicalises nested object schemas on every
draw, about 0.2 s per schema here) and every result is checked against META. Number bounds
are drawn in quarters: finer ones hit a known xgrammar precision bug, kept as a strict xfail at
the end of this file.
"""

from __future__ import annotations

import json
import random
import re
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any
from unittest import mock

import jsonschema  # type: ignore[import-untyped]
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.internal.conjecture import utils as conjecture_utils
from hypothesis_jsonschema import _from_schema, from_schema

from llm_inference.engine.api import (
    FinishReason,
    FormatKind,
    InvalidRequest,
    OutputFormatSpec,
    SamplingOptions,
)
from llm_inference.engine.config import EngineConfig
from llm_inference.engine.core import EngineCore, load_tokenizer
from llm_inference.engine.grammar import GrammarCache
from llm_inference.engine.loader import load_model

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[5]
REAL_WORLD = ROOT / "bench" / "data" / "schemas" / "index.json"
GENERATED = 400  # schemas drawn (before removing duplicates)
SEEDS_PER_REAL_SCHEMA = 3
MAX_TOKENS = 256
MIN_FINISHED_SHARE = 0.3  # below this the property says little: most outputs were cut off
FIRST_TOKEN_ID = 6  # ids below are the demo tokenizer's special tokens

NAMES = ["id", "name", "title", "count", "price", "active", "tags", "when", "owner", "kind"]
WORDS = ["red", "green", "blue", "low", "high", "n/a", "", "é", 'say "hi"', "a\\b"]
FORMATS = ["date", "date-time", "time", "email", "ipv4", "ipv6", "uuid", "uri"]


def _int(low: int, high: int) -> dict[str, Any]:
    return {"type": "integer", "minimum": low, "maximum": high}


def _shape(kind: str, musts: list[str], **keywords: Any) -> dict[str, Any]:
    """Meta-schema of one kind of schema node: {"type": kind} and the given keywords (`musts`
    among them required)."""
    return {
        "type": "object",
        "properties": {"type": {"const": kind}, **keywords},
        "required": ["type", *musts],
        "additionalProperties": False,
    }


# Number bounds in quarters: xgrammar 0.2.9 writes number ranges with 6 fraction digits, and a
# range holding no such number becomes an empty rule (see test_number_bounds_finer_than_...).
_BOUND = {"type": "number", "minimum": -1000, "maximum": 1000, "multipleOf": 0.25}
SCALAR_META: dict[str, Any] = {
    "anyOf": [
        _shape("string", [], minLength=_int(0, 4), maxLength=_int(1, 24)),
        _shape(
            "string",
            ["enum"],
            enum={
                "type": "array",
                "items": {"enum": WORDS},
                "minItems": 1,
                "maxItems": 4,
                "uniqueItems": True,
            },
        ),
        _shape("string", ["format"], format={"enum": FORMATS}),
        _shape("integer", [], minimum=_int(-1000, 1000), maximum=_int(-1000, 1000)),
        _shape("number", [], minimum=_BOUND, maximum=_BOUND),
        _shape("boolean", []),
    ]
}


def _array_meta(items: dict[str, Any]) -> dict[str, Any]:
    return _shape("array", ["items"], items=items, minItems=_int(0, 3), maxItems=_int(0, 5))


def _any_of_meta(branch: dict[str, Any]) -> dict[str, Any]:
    two = {"type": "array", "items": branch, "minItems": 2, "maxItems": 2}
    return {
        "type": "object",
        "properties": {"anyOf": two},
        "required": ["anyOf"],
        "additionalProperties": False,
    }


def _object_meta(child: dict[str, Any], max_properties: int) -> dict[str, Any]:
    props = {
        "type": "object",
        "propertyNames": {"enum": NAMES},
        "additionalProperties": child,
        "minProperties": 1,
        "maxProperties": max_properties,
    }
    required = {"type": "array", "items": {"enum": NAMES}, "uniqueItems": True, "maxItems": 4}
    return _shape(
        "object",
        ["properties"],
        properties=props,
        required=required,
        additionalProperties={"const": False},
    )


LEAF_META: dict[str, Any] = {
    "anyOf": [SCALAR_META, _array_meta(SCALAR_META), _any_of_meta(SCALAR_META)]
}
INNER_META = _object_meta(LEAF_META, 3)
META = _object_meta(
    {
        "anyOf": [
            LEAF_META,
            INNER_META,
            _array_meta(INNER_META),
            _any_of_meta({"anyOf": [INNER_META, SCALAR_META]}),
        ]
    },
    4,
)


class _Many:
    """hypothesis-jsonschema 0.23.1 drives Hypothesis' private `many` through `.more()`, which
    Hypothesis 6.170 replaced by a context manager; this adapter restores `.more()` on top of
    it for the duration of the draws (without it every object schema raises AttributeError)."""

    def __init__(self, data: Any, min_size: int, max_size: float, average_size: float) -> None:
        self._many = conjecture_utils.many(
            data, min_size=min_size, max_size=max_size, average_size=average_size
        )
        self._many.__enter__()
        self._elements = iter(self._many)

    def more(self) -> bool:
        for _ in self._elements:
            return True
        self._many.__exit__(None, None, None)
        return False

    def reject(self, why: str | None = None) -> None:
        self._many.reject(why)


def tidy(node: Any) -> Any:
    """Make a drawn schema satisfiable: ordered bounds, required names that are declared."""
    if isinstance(node, list):
        return [tidy(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: tidy(value) for key, value in node.items()}
    for low, high in (("minimum", "maximum"), ("minLength", "maxLength"), ("minItems", "maxItems")):
        if low in out and high in out and out[low] > out[high]:
            out[low], out[high] = out[high], out[low]
    if "properties" in out:
        required = [name for name in out.pop("required", []) if name in out["properties"]]
        if required:
            out["required"] = required
    return out


def _objects(child: st.SearchStrategy[Any], max_properties: int) -> st.SearchStrategy[Any]:
    def build(props: dict[str, Any], required: list[str], closed: bool) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "object", "properties": props, "required": required}
        return {**schema, "additionalProperties": False} if closed else schema

    names = st.sampled_from(NAMES)
    return st.builds(
        build,
        st.dictionaries(names, child, min_size=1, max_size=max_properties),
        st.lists(names, unique=True, max_size=4),
        st.booleans(),
    )


def _arrays(items: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    bounds = st.fixed_dictionaries(
        {}, optional={"minItems": st.integers(0, 3), "maxItems": st.integers(0, 5)}
    )
    return st.builds(lambda item, extra: {"type": "array", "items": item, **extra}, items, bounds)


def schema_strategy() -> st.SearchStrategy[Any]:
    scalar = from_schema(SCALAR_META)
    leaf = from_schema(LEAF_META)
    inner = _objects(leaf, 3)
    pair = st.lists(st.one_of(inner, scalar), min_size=2, max_size=2)
    child = st.one_of(leaf, inner, _arrays(inner), pair.map(lambda two: {"anyOf": two}))
    return _objects(child, 4).map(tidy)


def generated_schemas(count: int) -> list[Any]:
    """`count` draws (the same ones every run), duplicates removed, each an instance of META."""
    drawn: list[Any] = []

    @settings(
        max_examples=count,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(schema_strategy())
    def collect(schema: Any) -> None:
        drawn.append(schema)

    shim = types.SimpleNamespace(many=_Many)
    with mock.patch.object(_from_schema, "cu", shim):
        collect()
    unique = list({json.dumps(s, sort_keys=True): s for s in drawn}.values())
    meta = jsonschema.Draft202012Validator(META)
    for schema in unique:
        meta.validate(schema)
    return unique


# --- formats jsonschema cannot check without optional packages --------------------------------

_TIME = r"(?:[01]\d|2[0-3]):[0-5]\d:(?:[0-5]\d|60)(?:\.\d+)?(?:[Zz]|[+-](?:[01]\d|2[0-3]):[0-5]\d)"
_URI_CHARS = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?#\[\]]|%[0-9A-Fa-f]{2})*"
_PATTERNS = {
    "time": re.compile(f"^{_TIME}$"),
    "date-time": re.compile(rf"^(\d{{4}}-\d\d-\d\d)[Tt]{_TIME}$"),
    "uri": re.compile(rf"^[A-Za-z][A-Za-z0-9+.\-]*:{_URI_CHARS}$"),
    "uri-reference": re.compile(rf"^{_URI_CHARS}$"),
}


def format_checker() -> jsonschema.FormatChecker:
    """jsonschema's checkers plus RFC 3339 time/date-time and RFC 3986 uri (by pattern)."""
    checker = jsonschema.FormatChecker()
    for name, pattern in _PATTERNS.items():
        checker.checks(name)(_matcher(pattern))
    return checker


def _matcher(pattern: re.Pattern[str]) -> Callable[[object], bool]:
    def check(instance: object) -> bool:
        if not isinstance(instance, str):
            return True
        match = pattern.match(instance)
        if match is None:
            return False
        if match.groups():
            date.fromisoformat(match.group(1))  # ValueError (invalid) for 2023-02-30
        return True

    return check


# --- running the batch -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Case:
    """One request: a schema, where it came from, and its seed."""

    label: str
    schema: Any
    seed: int


@dataclass(slots=True)
class Output:
    text: str = ""
    tokens: int = 0
    finish: FinishReason | None = None


def real_world_schemas() -> list[tuple[str, Any]]:
    entries = json.loads(REAL_WORLD.read_text("utf-8"))["schemas"]
    return [(entry["name"], entry["schema"]) for entry in entries]


def spec(schema: Any) -> OutputFormatSpec:
    return OutputFormatSpec(FormatKind.JSON_SCHEMA, json.dumps(schema))


def accepted(grammars: GrammarCache, schema: Any) -> bool:
    try:
        grammars.compile(spec(schema))
    except InvalidRequest:
        return False
    return True


def run_batch(core: EngineCore, cases: list[Case]) -> dict[str, Output]:
    """Submit every case at once (random prompts of 8-24 tokens); step until all ended."""
    rng = random.Random(0)
    outputs: dict[str, Output] = {}
    for i, case in enumerate(cases):
        prompt = [rng.randrange(FIRST_TOKEN_ID, 4096) for _ in range(rng.randint(8, 24))]
        options = SamplingOptions(
            temperature=1.0, seed=case.seed, max_tokens=MAX_TOKENS, output_format=spec(case.schema)
        )
        core.add_request(f"r{i}", prompt, options)
        outputs[f"r{i}"] = Output()
    while core.has_work:
        for emitted in core.step():
            out, event = outputs[emitted.request_id], emitted.event
            out.text += event.text_delta
            out.tokens += len(event.token_ids)
            out.finish = event.finish_reason or out.finish
    return outputs


def violation(case: Case, text: str, checker: jsonschema.FormatChecker) -> str | None:
    """Why `text` fails the case's schema, or None when it parses and validates."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"not JSON ({exc})"
    validator_cls = jsonschema.validators.validator_for(
        case.schema, jsonschema.Draft202012Validator
    )
    error = jsonschema.exceptions.best_match(
        validator_cls(case.schema, format_checker=checker).iter_errors(value)
    )
    return None if error is None else f"{error.message} at {list(error.absolute_path)}"


@pytest.fixture(scope="module")
def grammars(demo_model_dir: Path) -> Iterator[GrammarCache]:
    cache = GrammarCache(demo_model_dir / "tokenizer.json", vocab_size=4096, stop_token_ids=(1,))
    yield cache
    cache.close()


@pytest.fixture(scope="module")
def core(demo_model_dir: Path, grammars: GrammarCache) -> EngineCore:
    config = EngineConfig(kv_cache_memory_bytes=128 << 20, max_num_seqs=64)
    model = load_model(demo_model_dir, dtype="float32", device="cpu", max_positions=2048)
    tokenizer = load_tokenizer(demo_model_dir)
    return EngineCore(model, config, model_name="demo", tokenizer=tokenizer, grammars=grammars)


def test_accepted_schemas_only_yield_valid_json(
    core: EngineCore, grammars: GrammarCache, record_property: Callable[[str, object], None]
) -> None:
    start = time.perf_counter()
    generated = generated_schemas(GENERATED)
    refused = [s for s in generated if not accepted(grammars, s)]
    assert not refused, f"the engine refused {len(refused)} META schemas, e.g. {refused[0]}"
    real = real_world_schemas()
    real_ok = [(name, s) for name, s in real if accepted(grammars, s)]
    cases = [Case(f"generated[{i}]", s, seed=i) for i, s in enumerate(generated)]
    cases += [
        Case(name, s, seed=1000 + k) for name, s in real_ok for k in range(SEEDS_PER_REAL_SCHEMA)
    ]
    outputs = run_batch(core, cases)

    checker = format_checker()
    finished = [
        (c, o)
        for c, o in zip(cases, outputs.values(), strict=True)
        if o.finish is FinishReason.STOP
    ]
    failures = [
        (c, o.text, why) for c, o in finished if (why := violation(c, o.text, checker)) is not None
    ]
    finishes = {o.finish for o in outputs.values()}
    share = len(finished) / len(cases)
    stats = {
        "generated_schemas": len(generated),
        "real_world_accepted": f"{len(real_ok)}/{len(real)}",
        "requests": len(cases),
        "finished_stop": len(finished),
        "validated": len(finished) - len(failures),
        "finished_share": round(share, 3),
        "output_tokens": sum(o.tokens for o in outputs.values()),
        "seconds": round(time.perf_counter() - start, 1),
    }
    print(f"\nschema property: {json.dumps(stats)}")
    for key, value in stats.items():
        record_property(key, value)

    assert not failures, "\n".join(
        f"{c.label} seed {c.seed}: {why}\n  schema {json.dumps(c.schema)}\n  output {text!r}"
        for c, text, why in failures[:5]
    )
    assert finishes <= {FinishReason.STOP, FinishReason.LENGTH}, finishes
    assert share >= MIN_FINISHED_SHARE, stats


# Found by this property with unrestricted float bounds: xgrammar 0.2.9 writes numbers with
# at most 6 fraction digits, so these ranges compiled to an empty rule ({"x":}, not JSON). The
# engine now refuses them up front, naming the keyword and its path.
FINE_BOUNDS = [
    {"type": "number", "minimum": 25.247631907875757, "maximum": 25.247631907875757},
    {"type": "number", "minimum": 2.0380059683757687e-210, "maximum": 9.50137270753487e-117},
]


@pytest.mark.parametrize("bounds", FINE_BOUNDS, ids=["min=max", "tiny range"])
def test_number_bounds_finer_than_xgrammar_precision_are_refused(
    grammars: GrammarCache, bounds: dict[str, Any]
) -> None:
    schema = {"type": "object", "properties": {"x": bounds}, "required": ["x"]}
    spec = OutputFormatSpec(FormatKind.JSON_SCHEMA, spec=json.dumps(schema))
    with pytest.raises(InvalidRequest, match=r"minimum.*\$\.properties\.x.*6 decimals"):
        grammars.compile(spec)
