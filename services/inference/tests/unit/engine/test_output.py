"""Detokenization and stop handling: UTF-8 safety, stop strings held back and removed."""

from __future__ import annotations

from collections.abc import Sequence as Seq

from llm_common.detokenizer import IncrementalDetokenizer
from llm_inference.engine.api import FinishReason, SamplingOptions
from llm_inference.engine.output import RequestState
from llm_inference.engine.sequence import Sequence


class ByteTokenizer:
    """Token i is byte i (ids >= 256 are special and skipped), like a byte-level BPE."""

    def decode(self, ids: Seq[int], skip_special_tokens: bool = True) -> str:
        data = bytes(i for i in ids if i < 256)
        return data.decode("utf-8", errors="replace")


def _ids(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def test_detokenizer_never_splits_a_utf8_character() -> None:
    detok = IncrementalDetokenizer(ByteTokenizer(), _ids("say: "))
    deltas = [detok.push(t) for t in _ids("héllo €")]
    assert "".join(deltas) + detok.finish() == "héllo €"
    assert all("\ufffd" not in d for d in deltas)
    assert deltas[1] == ""
    assert deltas[2] == "é"


def test_detokenizer_flushes_an_incomplete_tail_on_finish() -> None:
    detok = IncrementalDetokenizer(ByteTokenizer())
    assert detok.push(0xE2) == ""
    assert detok.finish() == "\ufffd"


def _state(options: SamplingOptions, eos: tuple[int, ...] = (300,)) -> RequestState:
    prompt = _ids("Q: ")
    seq = Sequence("r", list(prompt), len(prompt), options, options.max_tokens)
    return RequestState(seq, ByteTokenizer(), eos, arrival=0.0)


def _feed(state: RequestState, tokens: list[int]) -> tuple[str, FinishReason | None, int]:
    text = ""
    count = 0
    for token in tokens:
        event = state.append(token, None, now=1.0)
        text += event.text_delta
        count += 1
        if event.finish_reason is not None:
            return text, event.finish_reason, count
    return text, None, count


def test_stop_string_is_removed_and_text_before_it_kept() -> None:
    state = _state(SamplingOptions(max_tokens=100, stop_strings=("END",)))
    text, reason, used = _feed(state, _ids("hello wENDorld"))
    assert (text, reason) == ("hello w", FinishReason.STOP)
    assert used == len("hello wEND")


def test_text_that_only_starts_a_stop_string_is_released_later() -> None:
    state = _state(SamplingOptions(max_tokens=9, stop_strings=("ENDX",)))
    text, reason, _ = _feed(state, _ids("ab ENDab!"))
    assert (text, reason) == ("ab ENDab!", FinishReason.LENGTH)


def test_earliest_of_several_stop_strings_wins() -> None:
    state = _state(SamplingOptions(max_tokens=100, stop_strings=("zz", "b")))
    text, reason, _ = _feed(state, _ids("aabzz"))
    assert (text, reason) == ("aa", FinishReason.STOP)


def test_eos_stops_unless_ignored_and_stop_ids_always_stop() -> None:
    text, reason, used = _feed(_state(SamplingOptions(max_tokens=10)), [*_ids("ok"), 300, 65])
    assert (text, reason, used) == ("ok", FinishReason.STOP, 3)
    ignoring = _state(SamplingOptions(max_tokens=4, ignore_eos=True))
    assert _feed(ignoring, [*_ids("ok"), 300, 65])[1:] == (FinishReason.LENGTH, 4)
    stop_ids = _state(SamplingOptions(max_tokens=10, ignore_eos=True, stop_token_ids=(66,)))
    assert _feed(stop_ids, _ids("aaBa")) == ("aa", FinishReason.STOP, 3)


def test_final_event_carries_usage_and_timings() -> None:
    state = _state(SamplingOptions(max_tokens=2, logprobs=True))
    state.mark_scheduled(0.5)
    first = state.append(65, -0.5, now=1.0)
    last = state.append(66, -1.5, now=3.0)
    assert first.finish_reason is None
    assert first.timings is None
    assert first.logprobs == (-0.5,)
    assert last.finish_reason is FinishReason.LENGTH
    assert (last.prompt_tokens, last.completion_tokens) == (3, 2)
    assert last.timings is not None
    assert last.timings.queue_ms == 500
    assert last.timings.ttft_ms == 1000
    assert last.timings.decode_ms == 2000


def test_detokenize_false_streams_no_text_but_still_matches_stop_strings() -> None:
    options = SamplingOptions(max_tokens=50, stop_strings=("!",), detokenize=False)
    text, reason, used = _feed(_state(options), _ids("hi!there"))
    assert (text, reason, used) == ("", FinishReason.STOP, 3)
