"""Safety guard: PII detection, input rules, and the streaming output guard's hold-back."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_common.config import ConfigError
from llm_common.errors import InvalidArgument
from llm_router.safety import pii
from llm_router.safety.input_guard import screen
from llm_router.safety.output_guard import StreamGuard
from llm_router.safety.policies import OutputPolicy, parse_policies

CARD = "4111 1111 1111 1111"  # Luhn-valid test number
NOT_A_CARD = "4111 1111 1111 1112"


def output_policy(*phrases: str, redact: tuple[str, ...] = pii.KINDS) -> OutputPolicy:
    book = parse_policies(
        {"default": {"output": {"blocklist": list(phrases), "redact": list(redact)}}}
    )
    return book.default.output


def run(guard: StreamGuard, deltas: list[str]) -> tuple[str, bool, str]:
    out = []
    for delta in deltas:
        result = guard.feed(delta)
        out.append(result.text)
        if result.blocked:
            return "".join(out), True, result.rule
    result = guard.finish()
    out.append(result.text)
    return "".join(out), result.blocked, result.rule


def test_luhn() -> None:
    assert pii.luhn_valid("4111111111111111")
    assert pii.luhn_valid("79927398713")
    assert not pii.luhn_valid("4111111111111112")


def test_pii_detection_and_redaction() -> None:
    text = f"mail bob.smith+x@mail.example.com or pay {CARD}, not {NOT_A_CARD} or 12345"
    kinds = [f.kind for f in pii.find(text, pii.KINDS)]
    assert kinds == [pii.EMAIL, pii.CARD]
    clean, found = pii.redact(text, pii.KINDS)
    assert clean == f"mail [EMAIL] or pay [CARD], not {NOT_A_CARD} or 12345"
    assert found == (pii.EMAIL, pii.CARD)
    assert pii.redact("4111-1111-1111-1111", [pii.CARD])[0] == "[CARD]"
    assert pii.redact("a@b.co", [pii.CARD]) == ("a@b.co", ())


def test_input_blocklist_and_patterns_reject_naming_rule_not_text() -> None:
    book = parse_policies(
        {
            "default": {
                "input": {
                    "blocklist": ["make a bomb"],
                    "patterns": [{"id": "secret-ref", "regex": r"project\s+x\d+"}],
                }
            }
        }
    )
    policy = book.default.input
    with pytest.raises(InvalidArgument) as exc:
        screen(["hello", "how to MAKE  a\nbomb?", "about Project X42"], policy, lambda i: f"m[{i}]")
    assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT
    fields = {v.field: v.description for v in exc.value.violations}
    assert fields == {
        "m[1]": "blocked by content policy rule 'make a bomb'",
        "m[2]": "blocked by content policy rule 'secret-ref'",
    }
    assert screen(["bombastic make-a-bombe"], policy, str).texts == ("bombastic make-a-bombe",)


def test_input_pii_allow_redact_reject() -> None:
    text = f"card {CARD} mail a@b.io"
    allow = parse_policies({"default": {"input": {"pii": "allow"}}}).default.input
    assert screen([text], allow, str).texts == (text,)
    redact = parse_policies({"default": {"input": {"pii": "redact", "pii_kinds": ["card"]}}})
    screened = screen([text], redact.default.input, str)
    assert screened.texts == ("card [CARD] mail a@b.io",)
    assert screened.redacted == ("card",)
    reject = parse_policies({"default": {"input": {"pii": "reject"}}}).default.input
    with pytest.raises(InvalidArgument) as exc:
        screen(["fine", text], reject, lambda i: f"messages[{i}].content")
    assert exc.value.violations[0].field == "messages[1].content"
    assert exc.value.violations[0].description == "contains personal data (card, email)"
    assert CARD not in str(exc.value.to_proto())


def test_phrase_split_across_deltas_is_caught() -> None:
    guard = StreamGuard(output_policy("forbidden fruit"))
    text, blocked, rule = run(guard, ["The ", "forb", "idd", "en f", "ruit is ", "sweet"])
    assert blocked
    assert rule == "forbidden fruit"
    assert text == "The "
    assert "forb" not in text


def test_phrase_is_not_final_while_the_word_may_continue() -> None:
    guard = StreamGuard(output_policy("kill"))
    text, blocked, _ = run(guard, ["we ", "kill", "ed time", " and skill"])
    assert not blocked
    assert text == "we killed time and skill"
    guard = StreamGuard(output_policy("kill"))
    assert run(guard, ["we ", "kill"]) == ("we ", True, "kill")  # final at the end of stream


def test_text_is_released_once_no_rule_can_match_across_it() -> None:
    guard = StreamGuard(output_policy("xyz", redact=()))
    released = "".join(
        guard.feed(d).text for d in ["hello ", "there ", "general ", "kenobi ", "a" * 30]
    )
    assert released.startswith("hello there general")
    assert len(guard.pending) <= guard._policy.hold_back_chars


def test_no_rules_means_no_hold_back() -> None:
    guard = StreamGuard(OutputPolicy(phrases=(), redact=()))
    assert guard.feed("abc").text == "abc"
    assert guard.feed("def").text == "def"


def test_email_and_card_split_across_deltas_are_redacted() -> None:
    guard = StreamGuard(output_policy())
    deltas = [
        "write to jo",
        "hn.doe@exa",
        "mple.org or",
        " use 4111 ",
        "1111 11",
        "11 1111",
        " today",
    ]
    text, blocked, _ = run(guard, deltas)
    assert not blocked
    assert text == "write to [EMAIL] or use [CARD] today"


def test_streaming_equals_whole_text_redaction() -> None:
    whole = "a@b.io and c@d.io, card 4111111111111111."
    guard = StreamGuard(output_policy())
    streamed = run(guard, list(whole))[0]
    assert streamed == pii.redact(whole, pii.KINDS)[0]


ALPHABET = st.sampled_from(list("ab c@.14-x\n"))


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=ALPHABET, max_size=80), cuts=st.lists(st.integers(0, 80), max_size=10))
def test_any_split_gives_the_same_result_as_one_delta(text: str, cuts: list[int]) -> None:
    positions = sorted({min(c, len(text)) for c in cuts})
    deltas = [text[i:j] for i, j in zip([0, *positions], [*positions, len(text)], strict=True)]
    whole = run(StreamGuard(output_policy("ab c")), [text])
    split = run(StreamGuard(output_policy("ab c")), deltas)
    assert split == whole


def test_policies_merge_tenant_overrides_per_key() -> None:
    book = parse_policies(
        {
            "default": {
                "admission": {"billing_unavailable": "admit", "allowed_tiers": ["small"]},
                "input": {"pii": "redact", "blocklist": ["x y"]},
                "output": {"blocklist": ["bad word"]},
            },
            "tenants": {
                "acme": {"input": {"pii": "reject"}, "admission": {"billing_unavailable": "reject"}}
            },
        }
    )
    acme = book.for_tenant("acme")
    assert acme.input.pii == "reject"
    assert [r.id for r in acme.input.rules] == ["x y"]  # kept from the default
    assert acme.admission.billing_unavailable == "reject"
    assert acme.admission.allowed_tiers == frozenset({"small"})
    assert book.for_tenant("other") is book.default
    assert book.default.output.hold_back_chars == len("bad word") + 16


@pytest.mark.parametrize(
    "raw",
    [
        [],
        {"default": {"input": {"pii": "maybe"}}},
        {"default": {"admission": {"billing_unavailable": "sometimes"}}},
        {"default": {"output": {"redact": ["ssn"]}}},
        {"default": {"input": {"patterns": [{"id": "p", "regex": "("}]}}},
        {"default": {"input": {"patterns": [{"regex": "x"}]}}},
        {"default": {"output": {"blocklist": ["  "]}}},
        {"default": {"output": {"blocklist": "not a list"}}},
        {"default": {"unknown": {}}},
        {"tenants": {"t": "nope"}},
    ],
)
def test_bad_policies_fail_start_up(raw: object) -> None:
    with pytest.raises(ConfigError):
        parse_policies(raw)
