"""Constrained decoding on the demo checkpoint (random weights): every output that ends with
STOP matches its format, whatever the model would rather say; masks only touch their rows."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

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

PROMPT = [0, 17, 942, 311, 1200, 87]
INT = {"type": "integer", "minimum": 0, "maximum": 99}
NAME = {"type": "string", "maxLength": 6}
POINT = {"type": "object", "properties": {"x": INT, "y": INT}, "required": ["x", "y"]}
SCHEMAS: dict[str, dict[str, Any]] = {
    "nested objects": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"name": NAME, "age": INT},
                "required": ["name"],
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
    },
    "enums": {
        "type": "object",
        "properties": {"color": {"enum": ["red", "green"]}, "size": {"enum": [1, 2, None]}},
        "required": ["color", "size"],
    },
    "anyOf": {"type": "array", "items": {"anyOf": [INT, NAME, {"type": "null"}]}, "maxItems": 3},
    "$ref/$defs": {
        "$defs": {"point": POINT},
        "type": "object",
        "properties": {"from": {"$ref": "#/$defs/point"}, "to": {"$ref": "#/$defs/point"}},
        "required": ["from", "to"],
    },
    "array bounds": {"type": "array", "items": {**INT, "maximum": 9}, "minItems": 2, "maxItems": 4},
    "formats": {
        "type": "object",
        "properties": {
            "id": {"type": "string", "format": "uuid"},
            "day": {"type": "string", "format": "date"},
            "at": {"type": "string", "format": "date-time"},
            "ip": {"type": "string", "format": "ipv4"},
        },
        "required": ["id", "day", "at", "ip"],
    },
    "oneOf and pattern": {
        "oneOf": [
            {
                "type": "object",
                "properties": {"kind": {"const": "a"}, "n": INT},
                "required": ["kind"],
            },
            {"type": "string", "pattern": "^[a-c]{2}(-[0-9]+)?$"},
        ]
    },
}


@dataclass(frozen=True, slots=True)
class Output:
    """What one request produced."""

    token_ids: list[int]
    text: str
    finish: FinishReason


@pytest.fixture(scope="module")
def grammars(demo_model_dir: Path) -> Iterator[GrammarCache]:
    cache = GrammarCache(demo_model_dir / "tokenizer.json", vocab_size=4096, stop_token_ids=(1,))
    yield cache
    cache.close()


def make_core(path: Path, grammars: GrammarCache | None, **overrides: Any) -> EngineCore:
    config = replace(
        EngineConfig(kv_cache_memory_bytes=16 << 20, max_num_seqs=8, max_batched_tokens=256),
        **overrides,
    )
    model = load_model(path, dtype="float32", device="cpu", max_positions=2048)
    return EngineCore(
        model, config, model_name="demo", tokenizer=load_tokenizer(path), grammars=grammars
    )


@pytest.fixture
def core(demo_model_dir: Path, grammars: GrammarCache) -> EngineCore:
    return make_core(demo_model_dir, grammars)


def run(core: EngineCore, requests: Sequence[tuple[str, SamplingOptions]]) -> dict[str, Output]:
    """Submit all at once (same prompt, different ids), step until every request ended."""
    for request_id, options in requests:
        core.add_request(request_id, PROMPT, options)
    tokens: dict[str, list[int]] = {rid: [] for rid, _ in requests}
    texts = dict.fromkeys(tokens, "")
    finish: dict[str, FinishReason] = {}
    for _ in range(2000):
        if not core.has_work:
            break
        for emitted in core.step():
            event = emitted.event
            tokens[emitted.request_id].extend(event.token_ids)
            texts[emitted.request_id] += event.text_delta
            if event.finish_reason is not None:
                finish[emitted.request_id] = event.finish_reason
    assert not core.has_work
    return {rid: Output(tokens[rid], texts[rid], finish[rid]) for rid in tokens}


def schema_format(schema: Any) -> OutputFormatSpec:
    return OutputFormatSpec(FormatKind.JSON_SCHEMA, json.dumps(schema))


def sampled(spec: OutputFormatSpec, count: int, max_tokens: int = 200) -> list[SamplingOptions]:
    """`count` seeded temperature-1 options and one greedy, all under `spec`."""
    options = [
        SamplingOptions(temperature=1.0, seed=seed, max_tokens=max_tokens, output_format=spec)
        for seed in range(count)
    ]
    return [*options, SamplingOptions(temperature=0.0, max_tokens=max_tokens, output_format=spec)]


def stopped(outputs: dict[str, Output]) -> list[str]:
    """Texts of the outputs that ended with STOP (the others ran out of tokens)."""
    texts = [out.text for out in outputs.values() if out.finish is FinishReason.STOP]
    assert texts, "no output completed its format"
    return texts


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_json_schema_outputs_parse_and_validate(core: EngineCore, name: str) -> None:
    schema = SCHEMAS[name]
    options = sampled(schema_format(schema), 5)
    outputs = run(core, [(f"r{i}", o) for i, o in enumerate(options)])
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    validator = jsonschema.Draft202012Validator(schema, format_checker=checker)
    assert len(stopped(outputs)) >= len(options) // 2
    for text in stopped(outputs):
        validator.validate(json.loads(text))


def test_regex_grammar_choice_and_json_object(core: EngineCore) -> None:
    regex = "[a-z]{2,4}-[0-9]{1,3}(\\.[0-9])?"
    ebnf = 'root ::= item (", " item){0,2}\nitem ::= "(" [0-9] " " ("+" | "-") " " [0-9] ")"'
    choices = ("yes", "no", 'maybe "so"', "ünïcode")
    formats = {
        "regex": OutputFormatSpec(FormatKind.REGEX, regex),
        "grammar": OutputFormatSpec(FormatKind.GRAMMAR, ebnf),
        "choice": OutputFormatSpec(FormatKind.CHOICE, choices=choices),
        "json_object": OutputFormatSpec(FormatKind.JSON_OBJECT),
    }
    requests = [(f"{k}{i}", o) for k, f in formats.items() for i, o in enumerate(sampled(f, 1))]
    outputs = run(core, requests)
    done = {k: stopped({r: o for r, o in outputs.items() if r.startswith(k)}) for k in formats}
    assert all(re.fullmatch(regex, text) for text in done["regex"])
    item = r"\([0-9] [+-] [0-9]\)"
    assert all(re.fullmatch(rf"{item}(, {item}){{0,2}}", text) for text in done["grammar"])
    assert set(done["choice"]) <= set(choices)
    assert all(isinstance(json.loads(text), dict) for text in done["json_object"])


def test_tagged_json_items(core: EngineCore) -> None:
    schema = {"type": "object", "properties": {"name": {"const": "f"}, "arguments": POINT}}
    schema["required"] = ["name", "arguments"]
    spec = OutputFormatSpec(
        FormatKind.TAGGED_JSON,
        json.dumps(schema),
        begin="<tool_call>\n",
        end="\n</tool_call>",
        separator="\n",
        max_items=3,
    )
    outputs = run(core, [(f"t{i}", o) for i, o in enumerate(sampled(spec, 5))])
    item = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.DOTALL)
    for text in stopped(outputs):
        calls = item.findall(text)
        assert 1 <= len(calls) <= 3
        assert "\n".join(f"<tool_call>\n{c}\n</tool_call>" for c in calls) == text
        for call in calls:
            jsonschema.validate(json.loads(call), schema)


def test_masks_leave_unconstrained_rows_alone(demo_model_dir: Path, grammars: GrammarCache) -> None:
    greedy = SamplingOptions(temperature=0.0, max_tokens=24, ignore_eos=True)
    spec = schema_format(SCHEMAS["enums"])
    constrained = SamplingOptions(temperature=0.0, max_tokens=60, output_format=spec)
    free = run(make_core(demo_model_dir, grammars), [("free", greedy)])["free"]
    json_alone = run(make_core(demo_model_dir, grammars), [("json", constrained)])["json"]
    mixed = [("free", greedy), ("json", constrained)]
    mixed += [(f"s{i}", o) for i, o in enumerate(sampled(spec, 3))]
    mixed.append(("free2", replace(greedy, max_tokens=30)))
    together = run(make_core(demo_model_dir, grammars), mixed)
    assert together["free"].token_ids == free.token_ids
    assert together["free2"].token_ids[:24] == free.token_ids
    assert together["json"].token_ids == json_alone.token_ids
    assert together["json"].finish is FinishReason.STOP


def test_preemption_keeps_matchers_consistent(demo_model_dir: Path, grammars: GrammarCache) -> None:
    spec = schema_format(SCHEMAS["$ref/$defs"])
    requests = [(f"p{i}", o) for i, o in enumerate(sampled(spec, 5, max_tokens=150))]
    roomy = run(make_core(demo_model_dir, grammars, kv_block_size=4), requests)
    # 16 KiB per block of 4 tokens: 48 blocks hold 192 tokens for six growing sequences.
    tight_core = make_core(
        demo_model_dir, grammars, kv_cache_memory_bytes=48 * 16 << 10, kv_block_size=4
    )
    tight = run(tight_core, requests)
    assert tight_core.scheduler.num_preemptions > 0
    assert {r: o.token_ids for r, o in tight.items()} == {r: o.token_ids for r, o in roomy.items()}
    for text in stopped(tight):
        jsonschema.validate(json.loads(text), SCHEMAS["$ref/$defs"])


def test_min_tokens_cannot_hold_a_finished_grammar_open(core: EngineCore) -> None:
    spec = OutputFormatSpec(FormatKind.CHOICE, choices=("yes", "no"))
    options = SamplingOptions(temperature=0.0, max_tokens=20, min_tokens=10, output_format=spec)
    output = run(core, [("m", options)])["m"]
    assert output.finish is FinishReason.STOP
    assert output.text in ("yes", "no")


def test_mask_time_is_recorded(core: EngineCore) -> None:
    run(core, [("a", sampled(schema_format(SCHEMAS["enums"]), 0)[0])])
    stats = core.grammar_stats
    assert stats.masked_rows > 0
    assert stats.mask_ms
    assert all(ms >= 0 for ms in stats.mask_ms)


def test_format_errors_are_invalid_requests(core: EngineCore) -> None:
    bad = schema_format({"type": "object", "properties": {"a": {"not": {"type": "string"}}}})
    with pytest.raises(InvalidRequest) as caught:
        core.add_request("x", PROMPT, SamplingOptions(output_format=bad))
    assert str(caught.value).startswith('unsupported keyword "not" at $.properties.a')
    assert caught.value.field == "sampling.format.json_schema"
    spec = OutputFormatSpec(FormatKind.JSON_OBJECT)
    with pytest.raises(InvalidRequest) as caught:
        core.add_request("y", PROMPT, SamplingOptions(ignore_eos=True, output_format=spec))
    assert caught.value.field == "sampling.ignore_eos"
    assert not core.has_work


def test_a_checkpoint_without_tokenizer_rejects_formats(checkpoints: Any, kit: Any) -> None:
    core = kit.make_core(checkpoints("llama-gqa-untied"))
    options = SamplingOptions(output_format=OutputFormatSpec(FormatKind.JSON_OBJECT))
    with pytest.raises(InvalidRequest, match="constrained decoding needs the model's tokenizer"):
        core.add_request("x", [1, 2, 3], options)
