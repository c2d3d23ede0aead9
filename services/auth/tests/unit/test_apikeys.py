"""API key format, parsing and digests."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llm_auth.apikeys import (
    MalformedKeyError,
    digest,
    generate_key,
    looks_like_key,
    matches,
    parse_key,
)

PEPPER = b"p" * 32


def test_generated_key_round_trips_through_its_text() -> None:
    key = generate_key()
    assert key.text.startswith("sk-")
    assert parse_key(key.text) == key
    assert looks_like_key(key.text)


def test_rotation_keeps_the_key_id_and_changes_the_secret() -> None:
    key = generate_key()
    rotated = generate_key(key.key_id)
    assert rotated.key_id == key.key_id
    assert rotated.secret != key.secret


def test_repr_and_hint_never_show_the_secret() -> None:
    key = generate_key()
    assert key.secret not in repr(key)
    assert key.secret not in key.hint
    assert key.hint.startswith(f"sk-{key.key_id}.")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "sk-",
        "sk-0123456789abcdef",
        "sk-0123456789ABCDEF." + "a" * 43,  # upper-case key id
        "sk-0123456789abcdef." + "a" * 42,  # short secret
        "sk-0123456789abcdef." + "a" * 42 + "!",
        "pk-0123456789abcdef." + "a" * 43,
        "sk-0123456789abcdef." + "a" * 200,
    ],
)
def test_malformed_keys_are_rejected(text: str) -> None:
    with pytest.raises(MalformedKeyError):
        parse_key(text)


def test_digest_depends_on_pepper_and_key() -> None:
    key = generate_key()
    assert matches(PEPPER, key, digest(PEPPER, key))
    assert not matches(b"q" * 32, key, digest(PEPPER, key))
    assert not matches(PEPPER, generate_key(key.key_id), digest(PEPPER, key))
    assert not matches(PEPPER, key, "")
    assert key.secret not in digest(PEPPER, key)


@given(st.text(max_size=200))
def test_parse_never_crashes_on_arbitrary_text(text: str) -> None:
    try:
        key = parse_key(text)
    except MalformedKeyError:
        return
    assert key.text == text
