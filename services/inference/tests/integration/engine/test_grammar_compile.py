"""GrammarCache on the demo tokenizer: which JSON Schema keywords xgrammar 0.2.9 enforces (the
evidence behind schema_check), errors with their fields, size limits, sharing and the LRU."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest
import xgrammar as xgr

from llm_inference.engine.api import FormatKind, InvalidRequest, OutputFormatSpec
from llm_inference.engine.grammar import (
    MAX_CHOICES,
    MAX_SPEC_BYTES,
    NO_EOS,
    NO_TOKENIZER,
    CompiledFormat,
    GrammarCache,
    tokenizer_info,
)

VOCAB = 4096  # the demo model's logits
EOS = (1,)


@pytest.fixture(scope="module")
def tokenizer_file(demo_model_dir: Path) -> Path:
    return demo_model_dir / "tokenizer.json"


@pytest.fixture(scope="module")
def cache(tokenizer_file: Path) -> GrammarCache:
    return GrammarCache(tokenizer_file, vocab_size=VOCAB, stop_token_ids=EOS)


@pytest.fixture(scope="module")
def raw_compiler(tokenizer_file: Path) -> xgr.GrammarCompiler:
    """xgrammar without our checks: shows what it would do with a keyword we reject."""
    return xgr.GrammarCompiler(tokenizer_info(tokenizer_file, VOCAB, EOS), cache_enabled=False)


def schema_spec(schema: Any) -> OutputFormatSpec:
    return OutputFormatSpec(FormatKind.JSON_SCHEMA, json.dumps(schema))


def accepts(grammar: xgr.CompiledGrammar, text: str) -> bool:
    matcher = xgr.GrammarMatcher(grammar)
    return matcher.accept_string(text) and matcher.is_completed()


def _invalid(cache: GrammarCache, spec: OutputFormatSpec) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        cache.compile(spec)
    return caught.value


OBJ = {"type": "object", "properties": {"a": {"type": "integer"}}}
INTS = {"type": "integer"}
TREE = {"type": "object", "properties": {"c": {"type": "array", "items": {"$ref": "#/$defs/t"}}}}
# (schema, instances it allows, instances it forbids): xgrammar and jsonschema must agree.
ENFORCED: dict[str, tuple[dict[str, Any], list[Any], list[Any]]] = {
    "items+minItems/maxItems": (
        {"type": "array", "items": INTS, "minItems": 2, "maxItems": 3},
        [[1, 2], [1, 2, 3]],
        [[1], [1, 2, 3, 4], [1, "a"]],
    ),
    "enum": ({"enum": ["a", 1, None]}, ["a", 1, None], ["b", 2]),
    "const": ({"const": "x"}, ["x"], ["y"]),
    "anyOf": (
        {"anyOf": [INTS, {"type": "string", "maxLength": 2}]},
        [1, "ab"],
        ["abc", True],
    ),
    "oneOf (disjoint)": ({"oneOf": [INTS, {"type": "boolean"}]}, [1, True], ["s"]),
    "$ref/$defs": (
        {**OBJ, "$defs": {"n": {**INTS, "minimum": 3}}, "properties": {"a": {"$ref": "#/$defs/n"}}},
        [{"a": 3}, {}],
        [{"a": 2}],
    ),
    "recursive $ref": (
        {"$defs": {"t": TREE}, "$ref": "#/$defs/t"},
        [{"c": [{"c": []}]}],
        [{"c": [1]}],
    ),
    "required": (
        {"type": "object", "properties": {"a": INTS, "b": INTS}, "required": ["b"]},
        [{"b": 1}, {"a": 1, "b": 2}],
        [{"a": 1}],
    ),
    "additionalProperties false": (
        {**OBJ, "additionalProperties": False},
        [{"a": 1}],
        [{"a": 1, "b": 2}],
    ),
    "additionalProperties schema": (
        {"type": "object", "additionalProperties": INTS},
        [{"x": 1}],
        [{"x": "s"}],
    ),
    "propertyNames": (
        {"type": "object", "propertyNames": {"pattern": "^[ab]+$"}, "additionalProperties": INTS},
        [{"ab": 1}],
        [{"c": 1}],
    ),
    "maxProperties": (
        {"type": "object", "additionalProperties": INTS, "maxProperties": 1},
        [{"a": 1}],
        [{"a": 1, "b": 2}],
    ),
    "prefixItems": (
        {"type": "array", "prefixItems": [INTS, {"type": "string"}], "items": False},
        [[1, "a"]],
        [["a", 1], [1, "a", 2]],
    ),
    "pattern": ({"type": "string", "pattern": "^[a-c]+$"}, ["abc"], ["abd"]),
    "minLength/maxLength": (
        {"type": "string", "minLength": 2, "maxLength": 3},
        ["ab", "abc"],
        ["a", "abcd"],
    ),
    "minimum/maximum": ({**INTS, "minimum": 5, "maximum": 10}, [5, 10], [4, 11]),
    "exclusive bounds": (
        {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        [0.5],
        [0, 1, 1.5],
    ),
    "multipleOf (integer)": ({**INTS, "multipleOf": 3}, [3, 9], [4]),
    "format email": ({"type": "string", "format": "email"}, ["a@b.co"], ["ab"]),
    "format date": ({"type": "string", "format": "date"}, ["2024-01-31"], ["2024-13-01"]),
    "format time": ({"type": "string", "format": "time"}, ["10:00:00Z"], ["25:00"]),
    "format date-time": (
        {"type": "string", "format": "date-time"},
        ["2024-01-31T10:00:00Z"],
        ["2024-01-31"],
    ),
    "format uuid": (
        {"type": "string", "format": "uuid"},
        ["123e4567-e89b-12d3-a456-426614174000"],
        ["123"],
    ),
    "format ipv4": ({"type": "string", "format": "ipv4"}, ["1.2.3.4"], ["1.2.3"]),
    "format ipv6": ({"type": "string", "format": "ipv6"}, ["::1"], ["x"]),
    "format uri": ({"type": "string", "format": "uri"}, ["http://a.com/x"], ["a b"]),
}
# jsonschema checks these formats itself (time and date-time need an optional package).
CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER


@pytest.mark.parametrize("case", sorted(ENFORCED))
def test_supported_keywords_are_enforced(cache: GrammarCache, case: str) -> None:
    schema, allowed, forbidden = ENFORCED[case]
    grammar = cache.compile(schema_spec(schema)).grammar
    validator = jsonschema.Draft202012Validator(schema, format_checker=CHECKER)
    checked = schema.get("format") in (None, *CHECKER.checkers)
    for value in allowed:
        assert validator.is_valid(value), value
        assert accepts(grammar, json.dumps(value)), value
    for value in forbidden:
        assert not checked or not validator.is_valid(value), value
        assert not accepts(grammar, json.dumps(value)), value


# What xgrammar does with keywords schema_check rejects: it lets a violating value through.
IGNORED_BY_XGRAMMAR: dict[str, tuple[dict[str, Any], Any]] = {
    "not": ({"not": INTS}, 1),
    "if/then/else": ({"if": INTS, "then": {"minimum": 5}}, 1),
    "dependentRequired": (
        {"type": "object", "properties": {"a": {}, "b": {}}, "dependentRequired": {"a": ["b"]}},
        {"a": 1},
    ),
    "uniqueItems": ({"type": "array", "items": INTS, "uniqueItems": True}, [1, 1]),
    "contains": ({"type": "array", "items": INTS, "contains": {"const": 5}}, [1]),
    "allOf (two)": ({"allOf": [{**OBJ, "required": ["a"]}, {"type": "object"}]}, {}),
    "format (unknown)": ({"type": "string", "format": "iri"}, "not an iri"),
    "multipleOf (number)": ({"type": "number", "multipleOf": 0.5}, 1.2),
    "maxLength + pattern": ({"type": "string", "pattern": "a+", "maxLength": 2}, "aaa"),
    "$ref sibling": ({"$defs": {"n": INTS}, "$ref": "#/$defs/n", "minimum": 3}, 1),
    "required undeclared": ({**OBJ, "required": ["b"]}, {"a": 1}),
    "format hostname": ({"type": "string", "format": "hostname"}, "a" * 64 + ".com"),
}


@pytest.mark.parametrize("case", sorted(IGNORED_BY_XGRAMMAR))
def test_rejected_keywords_are_ones_xgrammar_ignores(
    cache: GrammarCache, raw_compiler: xgr.GrammarCompiler, case: str
) -> None:
    schema, violating = IGNORED_BY_XGRAMMAR[case]
    assert not jsonschema.Draft202012Validator(schema).is_valid(violating) or "format" in case
    assert accepts(raw_compiler.compile_json_schema(json.dumps(schema)), json.dumps(violating))
    error = _invalid(cache, schema_spec(schema))
    assert str(error).startswith("unsupported keyword ")
    assert error.field == "sampling.format.json_schema"


def test_patterns_that_could_emit_a_raw_quote_are_rejected(
    cache: GrammarCache, raw_compiler: xgr.GrammarCompiler
) -> None:
    schema = {"type": "string", "pattern": '^a"b$'}
    assert accepts(raw_compiler.compile_json_schema(json.dumps(schema)), '"a"b"')  # bad JSON
    assert 'unsupported keyword "pattern" at $' in str(_invalid(cache, schema_spec(schema)))
    negated = cache.compile(schema_spec({"type": "string", "pattern": '^[^"\\\\]+$'}))
    assert accepts(negated.grammar, '"ab"')


@pytest.mark.parametrize(
    "pattern",
    [
        "^(?:ab+)?$",  # xgrammar alone also matches "bb"
        "^1(?:a1{1,2})?b$",
        "^(?:b+a)?1?$",
        "^-?1+(\\.1+)?$",
        "^((ab)+)?1*$",
        "^(?:a|b+)?$",
    ],
)
def test_patterns_are_enforced_exactly(cache: GrammarCache, pattern: str) -> None:
    grammar = cache.compile(schema_spec({"type": "string", "pattern": pattern})).grammar
    for size in range(6):
        for chars in itertools.product("ab1.-", repeat=size):
            text = "".join(chars)
            assert accepts(grammar, json.dumps(text)) == bool(re.fullmatch(pattern, text)), text


def test_lengths_admit_no_raw_control_characters(
    cache: GrammarCache, raw_compiler: xgr.GrammarCompiler
) -> None:
    schema = {"type": "string", "minLength": 1, "maxLength": 3}
    assert accepts(raw_compiler.compile_json_schema(json.dumps(schema)), '"\x01"')  # bad JSON
    grammar = cache.compile(schema_spec(schema)).grammar
    assert not accepts(grammar, '"\x01"')
    assert accepts(grammar, '"üü😀"')  # code points, as JSON Schema counts
    assert not accepts(grammar, '"üüüü"')
    assert not accepts(grammar, '""')


def test_dates_are_exact(cache: GrammarCache) -> None:
    grammar = cache.compile(schema_spec({"type": "string", "format": "date"})).grammar
    for year in (1, 4, 100, 400, 1900, 2000, 2023, 2024):
        for month in range(14):
            for day in range(33):
                text = f"{year:04d}-{month:02d}-{day:02d}"
                assert accepts(grammar, json.dumps(text)) == _is_date(text), text
    assert not accepts(grammar, '"0000-01-01"')


PYTHON_PARSERS: dict[str, Callable[[str], object]] = {
    "time": datetime.time.fromisoformat,
    "date-time": datetime.datetime.fromisoformat,
    "ipv4": ipaddress.IPv4Address,
}


@pytest.mark.parametrize(
    ("fmt", "good", "bad"),
    [
        (
            "time",
            ["10:00:00Z", "23:59:59.123456789+05:30"],
            ["24:00:00Z", "10:00:00", "10:00:0012Z", "10:60:00Z"],
        ),
        (
            "date-time",
            ["2024-02-29T10:00:00Z", "2000-02-29T00:00:00-01:00"],
            ["2023-02-29T10:00:00Z", "2024-04-31T10:00:00Z", "2024-01-31T10:00:00"],
        ),
        ("ipv4", ["1.2.3.4", "255.255.255.255", "0.0.0.0"], ["01.2.3.4", "256.1.1.1", "1.2.3"]),
    ],
)
def test_rewritten_formats_are_exact(
    cache: GrammarCache, fmt: str, good: list[str], bad: list[str]
) -> None:
    grammar = cache.compile(schema_spec({"type": "string", "format": fmt})).grammar
    for text in good:
        PYTHON_PARSERS[fmt](text)
        assert accepts(grammar, json.dumps(text)), text
    for text in bad:
        assert not accepts(grammar, json.dumps(text)), text


def _is_date(text: str) -> bool:
    try:
        datetime.date.fromisoformat(text)
    except ValueError:
        return False
    return True


@pytest.mark.parametrize(
    ("spec", "field", "message"),
    [
        (OutputFormatSpec(FormatKind.JSON_SCHEMA, "{"), "json_schema", "invalid JSON"),
        (schema_spec({"type": "bogus"}), "json_schema", 'Unsupported type "bogus"'),
        (schema_spec({"properties": {"a": {"not": {}}}}), "json_schema", "$.properties.a"),
        (OutputFormatSpec(FormatKind.JSON_SCHEMA, "[" * 5000), "json_schema", "nests too deeply"),
        (OutputFormatSpec(FormatKind.REGEX, "(a"), "regex", "parenthesis"),
        (OutputFormatSpec(FormatKind.REGEX, "(?=a)a"), "regex", "Lookahead"),
        (OutputFormatSpec(FormatKind.GRAMMAR, 'root ::= "a'), "grammar", "EBNF lexer error"),
        (OutputFormatSpec(FormatKind.GRAMMAR, 'start ::= "a"'), "grammar", "root"),
        (OutputFormatSpec(FormatKind.GRAMMAR, "root ::= root"), "grammar", "no output can match"),
        (
            OutputFormatSpec(FormatKind.TAGGED_JSON, json.dumps({"if": {}}), begin="<t>"),
            "tagged_json.json_schema",
            'unsupported keyword "if" at $',
        ),
    ],
)
def test_bad_specs_are_invalid_requests_naming_the_field(
    cache: GrammarCache, spec: OutputFormatSpec, field: str, message: str
) -> None:
    error = _invalid(cache, spec)
    assert error.field == f"sampling.format.{field}"
    assert message in str(error)
    assert "/project/" not in str(error)  # xgrammar's log prefix is stripped


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (OutputFormatSpec(FormatKind.REGEX, "a" * (MAX_SPEC_BYTES + 1)), "regex"),
        (OutputFormatSpec(FormatKind.JSON_SCHEMA, ""), "json_schema"),
        (OutputFormatSpec(FormatKind.CHOICE, choices=()), "choice.values"),
        (OutputFormatSpec(FormatKind.CHOICE, choices=("a",) * (MAX_CHOICES + 1)), "choice.values"),
        (OutputFormatSpec(FormatKind.CHOICE, choices=("é" * 513,)), "choice.values"),
        (OutputFormatSpec(FormatKind.CHOICE, choices=("a", "")), "choice.values"),
        (OutputFormatSpec(FormatKind.TAGGED_JSON, begin="x" * 1025), "tagged_json.begin"),
        (OutputFormatSpec(FormatKind.TAGGED_JSON, max_items=65), "tagged_json.max_items"),
    ],
)
def test_size_limits(cache: GrammarCache, spec: OutputFormatSpec, field: str) -> None:
    size = cache.size
    assert _invalid(cache, spec).field == f"sampling.format.{field}"
    assert cache.size == size  # refused before anything was submitted


def test_choice_literals_are_escaped(cache: GrammarCache) -> None:
    values = ('say "hi"', "back\\slash", "new\nline", "ctl\x01", "ünï😀", "[x]|y*", "a", "ab")
    grammar = cache.compile(OutputFormatSpec(FormatKind.CHOICE, choices=values)).grammar
    assert all(accepts(grammar, value) for value in values)
    assert not accepts(grammar, "b")
    assert not accepts(grammar, 'say "hi" ')


def test_tagged_json_repeats_items_with_the_separator(cache: GrammarCache) -> None:
    schema = {**OBJ, "required": ["a"]}
    spec = OutputFormatSpec(
        FormatKind.TAGGED_JSON, json.dumps(schema), begin="<t>\n", end="\n</t>", separator="\n"
    )
    item = '<t>\n{"a": 1}\n</t>'
    one = cache.compile(spec).grammar
    assert accepts(one, item)
    assert not accepts(one, f"{item}\n{item}")  # max_items 0 or 1: exactly one
    three = cache.compile(replace(spec, max_items=3)).grammar
    assert all(accepts(three, "\n".join([item] * n)) for n in (1, 2, 3))
    assert not accepts(three, "\n".join([item] * 4))
    assert not accepts(three, '<t>\n{"a": "x"}\n</t>')
    bare = cache.compile(
        OutputFormatSpec(FormatKind.TAGGED_JSON, json.dumps(schema), separator="; ", max_items=2)
    ).grammar
    assert accepts(bare, '{"a": 1}; {"a": 2}')


def test_json_object_is_any_object(cache: GrammarCache) -> None:
    grammar = cache.compile(OutputFormatSpec(FormatKind.JSON_OBJECT)).grammar
    assert accepts(grammar, '{"a": [1, {"b": null}], "c": "d"}')
    assert not accepts(grammar, "[1]")
    assert not accepts(grammar, "{" + " " * 17 + "}")  # whitespace runs are bounded


def test_same_spec_shares_one_compilation(tokenizer_file: Path) -> None:
    cache = GrammarCache(tokenizer_file, vocab_size=VOCAB, stop_token_ids=EOS, capacity=2)
    spec = schema_spec({"type": "integer"})
    first, second = cache.submit(spec), cache.submit(spec)
    assert first is second
    compiled = first.result()
    assert cache.compile(spec) is compiled
    assert (cache.stats.misses, cache.stats.hits) == (1, 2)
    assert compiled.compile_ms > 0
    assert cache.stats.setup_ms > 0
    cache.compile(schema_spec({"type": "string"}))
    cache.compile(schema_spec({"type": "boolean"}))  # evicts the least recently used
    assert cache.size == 2
    assert cache.compile(spec) is not compiled
    cache.close()


def test_failures_are_cached_too(tokenizer_file: Path) -> None:
    cache = GrammarCache(tokenizer_file, vocab_size=VOCAB, stop_token_ids=EOS)
    spec = OutputFormatSpec(FormatKind.REGEX, "(a")
    assert str(_invalid(cache, spec)) == str(_invalid(cache, spec))
    assert (cache.stats.misses, cache.stats.hits) == (1, 1)


async def test_cancelled_waiter_leaves_the_shared_compile_running(cache: GrammarCache) -> None:
    names = [f"k{i}" for i in range(100)]  # ~0.15 s to compile: still running when cancelled
    date_time = {"type": "string", "format": "date-time"}
    schema = {"type": "object", "properties": dict.fromkeys(names, date_time), "required": names}
    waiter = asyncio.create_task(cache.compile_async(schema_spec(schema)))
    await asyncio.sleep(0.01)
    waiter.cancel()
    compiled = await cache.compile_async(schema_spec(schema))
    assert waiter.cancelled()
    assert isinstance(compiled, CompiledFormat)
    value = dict.fromkeys(names, "2024-01-31T10:00:00Z")
    assert accepts(compiled.grammar, json.dumps(value))


def test_missing_tokenizer_or_eos_is_an_invalid_request(tokenizer_file: Path) -> None:
    spec = OutputFormatSpec(FormatKind.JSON_OBJECT)
    no_tokenizer = GrammarCache(None, vocab_size=VOCAB, stop_token_ids=EOS)
    assert str(_invalid(no_tokenizer, spec)) == NO_TOKENIZER
    no_eos = GrammarCache(tokenizer_file, vocab_size=VOCAB, stop_token_ids=())
    assert str(_invalid(no_eos, spec)) == NO_EOS


def test_tokenizer_info_matches_transformers_apart_from_special_tokens(
    tokenizer_file: Path,
) -> None:
    from transformers import PreTrainedTokenizerFast

    padded = VOCAB + 10  # logits wider than the vocabulary
    ours = tokenizer_info(tokenizer_file, padded, EOS)
    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_file))  # type: ignore[no-untyped-call]
    theirs = xgr.TokenizerInfo.from_huggingface(hf_tokenizer, vocab_size=padded, stop_token_ids=[1])
    assert (ours.vocab_type, ours.add_prefix_space) == (theirs.vocab_type, theirs.add_prefix_space)
    assert ours.vocab_size == padded
    special = set(ours.special_token_ids)
    assert special == {0, 2, 3, 4, 5, *range(VOCAB, padded)}
    same = [i for i in range(VOCAB) if i not in special and i not in EOS]
    assert all(ours.decoded_vocab[i] == theirs.decoded_vocab[i] for i in same)
