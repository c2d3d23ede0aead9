"""The "llama3_json" parser: whole-output JSON calls, python tag, ';' lists, streaming."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_common.tools import ParsedOutput, ParsedToolCall, call_id, collect, parser_for

PARSER = parser_for("llama3_json")
SEED = "req-2:0"
WEATHER = '{"name": "get_weather", "parameters": {"city": "Paris é"}}'
NOW = '{"name": "now", "parameters": {}}'
WEATHER_CALL = ParsedToolCall(call_id(SEED, 0), "get_weather", '{"city":"Paris é"}')


def parse(text: str) -> ParsedOutput:
    return PARSER.parse(text, seed=SEED)


def streamed(text: str, cuts: Iterable[int]) -> ParsedOutput:
    bounds = [0, *sorted(set(cuts)), len(text)]
    stream = PARSER.stream(seed=SEED)
    updates = [stream.feed(text[a:b]) for a, b in itertools.pairwise(bounds)]
    return collect([*updates, stream.finish()])


@pytest.mark.parametrize(
    "text", [WEATHER, f"  {WEATHER}\n", f"<|python_tag|>{WEATHER}", f"<|python_tag|> {WEATHER};"]
)
def test_one_call(text: str) -> None:
    assert parse(text) == ParsedOutput("", (WEATHER_CALL,))


def test_several_calls_separated_by_semicolons() -> None:
    result = parse(f"{WEATHER}; {NOW} ;{NOW}")
    assert [c.name for c in result.tool_calls] == ["get_weather", "now", "now"]
    assert [c.id for c in result.tool_calls] == [call_id(SEED, i) for i in range(3)]
    assert result.content == ""


def test_arguments_key_and_double_encoding_are_accepted() -> None:
    text = '{"name": "f", "arguments": "{\\"a\\": [1, 2]}"}'
    assert parse(text).tool_calls == (ParsedToolCall(call_id(SEED, 0), "f", '{"a":[1,2]}'),)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "  \n",
        "The weather is fine.",
        f"Sure: {WEATHER}",  # text before the JSON
        f"{WEATHER} done",  # text after it
        f"{WEATHER};; {NOW}",
        '{"answer": 42}',  # JSON, but not a call
        '{"name": "f", "parameters": [1]}',
        '{"name": "f", "parameters": {"x": NaN}}',
        '[{"name": "f"}]',
        "<|python_tag|>print(1)",  # code interpreter, not JSON calls
        "<|python_tag|>",
        '{"name": "f", "parameters": {',  # cut off
    ],
)
def test_anything_else_is_all_content(text: str) -> None:
    assert parse(text) == ParsedOutput(text, ())


def test_plain_text_streams_at_once() -> None:
    stream = PARSER.stream(seed=SEED)
    assert stream.feed("  ").content == ""  # whitespace may precede a call
    assert stream.feed("<|pyt").content == ""  # may be the python tag
    assert stream.feed("hon_tag|>").content == ""
    assert stream.feed("x = 1").content == "  <|python_tag|>x = 1"
    assert stream.feed(" more").content == " more"
    assert stream.finish().content == ""


def test_json_is_held_until_the_end() -> None:
    stream = PARSER.stream(seed=SEED)
    assert stream.feed(WEATHER[:10]).content == ""
    assert stream.feed(WEATHER[10:]).calls == ()
    final = stream.finish()
    assert (final.content, final.calls[0].name) == ("", "get_weather")
    assert final.calls[0].arguments == WEATHER_CALL.arguments


EXAMPLES = [WEATHER, f"<|python_tag|>{WEATHER}; {NOW}", "Hello", f" {WEATHER} x", "<|pyx", ""]


@pytest.mark.parametrize("text", EXAMPLES)
def test_stream_equals_parse_at_every_split(text: str) -> None:
    expected = parse(text)
    assert streamed(text, range(len(text))) == expected
    for cut in range(len(text) + 1):
        assert streamed(text, [cut]) == expected


ATOMS = st.sampled_from([WEATHER, NOW, ";", " ", "\n", "<|python_tag|>", "<|py", "x", "{", "é"])


@settings(max_examples=300, deadline=None)
@given(st.lists(ATOMS, max_size=8), st.lists(st.integers(0, 300), max_size=10))
def test_stream_equals_parse_for_random_texts_and_splits(atoms: list[str], cuts: list[int]) -> None:
    text = "".join(atoms)
    assert streamed(text, [c for c in cuts if c <= len(text)]) == parse(text)
