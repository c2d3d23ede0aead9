"""IncrementalDetokenizer: deltas never split a UTF-8 character and add up to the full decode."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import (
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
)

from llm_common.detokenizer import MAX_HELD_TOKENS, REPLACEMENT_CHAR, IncrementalDetokenizer
from llm_testing import train_tiny_tokenizer

TEXTS = [
    "plain ASCII text, nothing special.",
    "Emoji 👍🏽 and a family 👩‍👩‍👧 in one line 🎉",
    "中文文本和日本語のテキスト、混在。",
    "Ünïcödé façade — naïve café ∑ 𝔘𝔫𝔦 ok",
    " leading space and trailing newline\n",
]


@pytest.fixture(scope="module")
def tiny_tokenizer() -> Tokenizer:
    return train_tiny_tokenizer()


@pytest.fixture(scope="module")
def demo_tokenizer(demo_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(demo_model_dir / "tokenizer.json"))


def deltas(tok: Tokenizer, ids: list[int], *, skip: bool = False) -> tuple[list[str], str]:
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    return [detok.push(i) for i in ids], detok.finish()


@pytest.mark.parametrize("text", TEXTS)
def test_every_prefix_of_the_stream(tiny_tokenizer: Tokenizer, text: str) -> None:
    ids = tiny_tokenizer.encode(text, add_special_tokens=False).ids
    for k in range(len(ids) + 1):
        expected = tiny_tokenizer.decode(ids[:k], skip_special_tokens=False)
        pushed, tail = deltas(tiny_tokenizer, ids[:k])
        emitted = "".join(pushed)
        assert all(REPLACEMENT_CHAR not in d for d in pushed)
        assert expected.startswith(emitted)
        assert emitted + tail == expected


def test_multibyte_characters_span_several_tokens(tiny_tokenizer: Tokenizer) -> None:
    # The test is only meaningful if the emoji really is split across byte-level tokens.
    ids = tiny_tokenizer.encode("👍", add_special_tokens=False).ids
    assert len(ids) > 1
    pushed, tail = deltas(tiny_tokenizer, ids)
    assert pushed == [""] * (len(ids) - 1) + ["👍"]
    assert tail == ""


def test_cjk_characters_come_out_whole(tiny_tokenizer: Tokenizer) -> None:
    text = "中文文本"
    ids = tiny_tokenizer.encode(text, add_special_tokens=False).ids
    pushed, _ = deltas(tiny_tokenizer, ids)
    assert "".join(pushed) == text
    assert all(len(d.encode()) % 3 == 0 for d in pushed)  # whole 3-byte characters only


def test_prompt_gives_context_but_is_not_emitted(tiny_tokenizer: Tokenizer) -> None:
    prompt = tiny_tokenizer.encode("Hello world,", add_special_tokens=False).ids
    generated = tiny_tokenizer.encode(" hello 👍 tokens", add_special_tokens=False).ids
    detok = IncrementalDetokenizer(tiny_tokenizer, prompt)
    text = detok.extend(generated) + detok.finish()
    assert text == " hello 👍 tokens"
    assert detok.text == text
    assert detok.token_ids == prompt + generated


def test_finish_flushes_an_incomplete_character(tiny_tokenizer: Tokenizer) -> None:
    first_byte = tiny_tokenizer.encode("👍", add_special_tokens=False).ids[:1]
    detok = IncrementalDetokenizer(tiny_tokenizer)
    assert detok.push(first_byte[0]) == ""
    assert detok.finish() == REPLACEMENT_CHAR
    assert detok.finish() == ""


def test_invalid_bytes_are_not_held_back_forever(tiny_tokenizer: Tokenizer) -> None:
    # Lead bytes of a 4-byte character, never completed: the text always ends in U+FFFD.
    lead = tiny_tokenizer.encode("👍", add_special_tokens=False).ids[0]
    detok = IncrementalDetokenizer(tiny_tokenizer)
    pushed = [detok.push(lead) for _ in range(3 * MAX_HELD_TOKENS)]
    assert pushed[: MAX_HELD_TOKENS - 1] == [""] * (MAX_HELD_TOKENS - 1)
    assert pushed[MAX_HELD_TOKENS - 1].endswith(REPLACEMENT_CHAR)


def test_special_tokens_kept_or_skipped(tiny_tokenizer: Tokenizer) -> None:
    ids = [*tiny_tokenizer.encode("Hello", add_special_tokens=False).ids, 1]  # 1 = </s>
    kept, _ = deltas(tiny_tokenizer, ids)
    skipped, _ = deltas(tiny_tokenizer, ids, skip=True)
    assert "".join(kept) == "Hello</s>"
    assert "".join(skipped) == "Hello"


def test_demo_tokenizer_round_trip(demo_tokenizer: Tokenizer) -> None:
    for text in TEXTS:
        ids = demo_tokenizer.encode(text, add_special_tokens=False).ids
        pushed, tail = deltas(demo_tokenizer, ids)
        assert all(REPLACEMENT_CHAR not in d for d in pushed)
        assert "".join(pushed) + tail == text


def metaspace_tokenizer() -> Tokenizer:
    """SentencePiece-style: the decoder drops the first token's leading space."""
    vocab = {"<unk>": 0, "▁Hello": 1, "▁world": 2, "!": 3, "▁again": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    return tok


def test_metaspace_leading_space_is_kept_mid_stream() -> None:
    tok = metaspace_tokenizer()
    ids = [1, 2, 3, 4]
    pushed, tail = deltas(tok, ids)
    assert pushed == ["Hello", " world", "!", " again"]
    assert tail == ""
    # With a prompt, the first generated token keeps its space.
    detok = IncrementalDetokenizer(tok, [1])
    assert detok.push(2) == " world"
