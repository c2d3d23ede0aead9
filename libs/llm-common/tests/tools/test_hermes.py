"""The "hermes" parser: <tool_call> blocks, content around them, streaming exactness."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_common.tools import (
    ParsedOutput,
    ParsedToolCall,
    StreamUpdate,
    ToolCallParser,
    call_id,
    collect,
    parser_for,
)

SEED = "req-1:0"


def pieces_at(text: str, cuts: Iterable[int]) -> list[str]:
    """`text` cut at the given positions (any order, duplicates allowed)."""
    bounds = [0, *sorted(set(cuts)), len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def stream_updates(parser: ToolCallParser, pieces: Sequence[str]) -> list[StreamUpdate]:
    stream = parser.stream(seed=SEED)
    return [*(stream.feed(piece) for piece in pieces), stream.finish()]


def streamed(parser: ToolCallParser, pieces: Sequence[str]) -> ParsedOutput:
    return collect(stream_updates(parser, pieces))


def assert_stream_matches(parser: ToolCallParser, text: str, cuts: Iterable[int]) -> None:
    """Streaming `text` in pieces gives exactly the unary parse, fragments well formed."""
    updates = stream_updates(parser, pieces_at(text, cuts))
    for update in updates:
        for delta in update.calls:  # each call arrives whole, id and name with it
            assert delta.id
            assert delta.name
    assert collect(updates) == parser.parse(text, seed=SEED)


PARSER = parser_for("hermes")


def block(name: str, arguments: Any = None, *, raw: str | None = None) -> str:
    body = raw if raw is not None else json.dumps({"name": name, "arguments": arguments or {}})
    return f"<tool_call>\n{body}\n</tool_call>"


def call(index: int, name: str, arguments: str = "{}") -> ParsedToolCall:
    return ParsedToolCall(call_id(SEED, index), name, arguments)


def parse(text: str) -> ParsedOutput:
    return PARSER.parse(text, seed=SEED)


WEATHER = block("get_weather", {"city": "Paris é", "days": [1, 2]})
WEATHER_CALL = call(0, "get_weather", '{"city":"Paris é","days":[1,2]}')
BAD_JSON = '<tool_call>\n{"name": "x", "arguments": {\n</tool_call>'

EXAMPLES = [
    "",
    "Plain answer, no calls.",
    WEATHER,
    f"Let me check.\n\n{WEATHER}",
    f"{WEATHER}\n{block('now')}\n",
    f"A {WEATHER} B",
    f"Hi\n{BAD_JSON}\n{WEATHER}\ntail",
    "a <tool_c",
    'x <tool_call>\n{"name": "now"}',  # unclosed but complete: a call
    'x <tool_call>\n{"name": "no',  # unclosed and incomplete: content
    "</tool_call><tool_call><tool_call>{}</tool_call>",
    '<tool_call>{"name": "a", "arguments": "{\\"k\\": 1}"}</tool_call>',
]


def test_content_before_a_call() -> None:
    assert parse(f"Let me check.\n\n{WEATHER}") == ParsedOutput("Let me check.", (WEATHER_CALL,))


def test_several_calls_and_layout_whitespace() -> None:
    text = f"\n{WEATHER}\n{block('now')}\n\n"
    assert parse(text) == ParsedOutput("", (WEATHER_CALL, call(1, "now")))


def test_text_between_and_after_calls_is_content() -> None:
    text = f"A {WEATHER} B {block('now')} C "
    assert parse(text) == ParsedOutput("ABC ", (WEATHER_CALL, call(1, "now")))


def test_no_calls_is_all_content() -> None:
    text = "Use <b>tags</b> and </tool_call> freely. "
    assert parse(text) == ParsedOutput(text, ())


@pytest.mark.parametrize(
    "bad",
    [
        BAD_JSON,
        block("", raw="[1, 2]"),  # not an object
        block("", raw='{"arguments": {}}'),  # no name
        block("", raw='{"name": "", "arguments": {}}'),
        block("", raw='{"name": "f", "arguments": [1]}'),  # arguments not an object
        block("", raw='{"name": "f", "arguments": "not json"}'),
        block("", raw='{"name": "f", "arguments": {"x": NaN}}'),  # NaN is not JSON
        "<tool_call></tool_call>",
    ],
)
def test_a_block_that_is_not_a_call_stays_content(bad: str) -> None:
    text = f"Before \n{bad}\n after"
    assert parse(text) == ParsedOutput(text, ())
    # Next to a valid call, only the whitespace touching the valid block goes.
    assert parse(f"{bad}\n{WEATHER}") == ParsedOutput(bad, (WEATHER_CALL,))


def test_argument_forms() -> None:
    double_encoded = '<tool_call>{"name": "a", "arguments": "{\\"k\\": 1}"}</tool_call>'
    assert parse(double_encoded).tool_calls == (call(0, "a", '{"k":1}'),)
    assert parse(block("", raw='{"name": "a"}')).tool_calls == (call(0, "a"),)
    spaced = block("", raw='{"name": "a", "arguments": {"b": [1, {"c": "ü"}]}, "x": 1}')
    assert parse(spaced).tool_calls == (call(0, "a", '{"b":[1,{"c":"ü"}]}'),)


def test_unclosed_block_at_the_end() -> None:
    # Models often stop right after the JSON: a complete call object is still a call.
    assert parse('ok <tool_call>\n{"name": "now"}\n') == ParsedOutput("ok", (call(0, "now"),))
    cut = 'ok <tool_call>\n{"name": "now", "argu'
    assert parse(cut) == ParsedOutput(cut, ())


def test_partial_open_tag_is_held_back() -> None:
    stream = PARSER.stream(seed=SEED)
    assert stream.feed("Hello <tool_").content == "Hello"
    assert stream.feed("x").content == " <tool_x"
    assert stream.feed(" <").content == ""
    assert stream.finish().content == " <"


def test_calls_arrive_as_soon_as_the_block_closes() -> None:
    stream = PARSER.stream(seed=SEED)
    opening, rest = WEATHER[:20], WEATHER[20:]
    assert stream.feed("Sure.\n" + opening).content == "Sure."
    update = stream.feed(rest)
    assert (update.content, update.calls[0].index, update.calls[0].name) == ("", 0, "get_weather")
    assert update.calls[0].id == call_id(SEED, 0)
    assert update.calls[0].arguments == WEATHER_CALL.arguments
    assert stream.finish().calls == ()


def test_ids_follow_the_seed() -> None:
    first = PARSER.parse(WEATHER, seed="a").tool_calls[0].id
    assert first == PARSER.parse(WEATHER, seed="a").tool_calls[0].id
    assert first != PARSER.parse(WEATHER, seed="b").tool_calls[0].id


@pytest.mark.parametrize("text", EXAMPLES)
def test_stream_equals_parse_at_every_split(text: str) -> None:
    assert_stream_matches(PARSER, text, [])
    assert_stream_matches(PARSER, text, range(len(text)))  # one character at a time
    for cut in range(len(text) + 1):
        assert_stream_matches(PARSER, text, [cut])


# Pieces that make tags, near-tags, JSON and whitespace collide at random boundaries.
ATOMS = st.sampled_from(
    [
        "<tool_call>",
        "</tool_call>",
        "<tool_",
        "</tool",
        "<",
        "\n",
        " ",
        "x",
        "é",
        '{"name": "f", "arguments": {"a": 1}}',
        '{"name": "g"}',
        "{",
        '"',
        WEATHER,
        BAD_JSON,
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(ATOMS, max_size=12), st.lists(st.integers(0, 400), max_size=12))
def test_stream_equals_parse_for_random_texts_and_splits(atoms: list[str], cuts: list[int]) -> None:
    text = "".join(atoms)
    assert_stream_matches(PARSER, text, [c for c in cuts if c <= len(text)])


TEXT = st.text(st.sampled_from("ab <>/\n\té"), max_size=8).filter(lambda s: "<tool_call>" not in s)
ARGS = st.dictionaries(st.sampled_from(["k", "ü", "n"]), st.integers() | st.text(max_size=3))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(TEXT, st.tuples(st.sampled_from(["f", "g_1"]), ARGS)), max_size=6))
def test_calls_and_content_are_recovered(items: list[str | tuple[str, dict[str, Any]]]) -> None:
    """Texts built from known content and calls parse back to them."""
    text = "".join(item if isinstance(item, str) else block(*item) for item in items)
    expected_calls = [item for item in items if isinstance(item, tuple)]
    result = parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == expected_calls
    assert result.content == _expected_content(items)
    assert streamed(PARSER, list(text)) == result


def _expected_content(items: list[str | tuple[str, dict[str, Any]]]) -> str:
    """Runs of text between calls, without the whitespace that touches a call."""
    runs: list[tuple[str, bool, bool]] = []  # (text, after a call, before a call)
    current: list[str] = []
    after_call = False
    for item in items:
        if isinstance(item, str):
            current.append(item)
            continue
        runs.append(("".join(current), after_call, True))
        current, after_call = [], True
    runs.append(("".join(current), after_call, False))
    out = []
    for text, after, before in runs:
        text = text.lstrip() if after else text
        out.append(text.rstrip() if before else text)
    return "".join(out)


def test_stream_updates_never_repeat_content() -> None:
    text = f"Intro {WEATHER} outro"
    updates = stream_updates(PARSER, list(text))
    assert "".join(u.content for u in updates) == "Introoutro"
