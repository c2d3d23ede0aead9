"""Per-request output state: stop conditions, incremental text (stop strings held back), timings."""

from __future__ import annotations

import time
from dataclasses import dataclass

from llm_common.detokenizer import Decoder, IncrementalDetokenizer

from .api import FinishReason, InvalidRequest, RequestTimings, Resume, TokenEvent, TopToken
from .sequence import Sequence


@dataclass(slots=True)
class _Clock:
    arrival: float
    first_scheduled: float | None = None
    first_token: float | None = None
    finished: float | None = None

    def timings(self) -> RequestTimings:
        end = self.finished if self.finished is not None else time.perf_counter()
        scheduled = self.first_scheduled if self.first_scheduled is not None else end
        first = self.first_token if self.first_token is not None else end
        return RequestTimings(
            queue_ms=(scheduled - self.arrival) * 1e3,
            prefill_ms=(first - scheduled) * 1e3,
            ttft_ms=(first - self.arrival) * 1e3,
            decode_ms=(end - first) * 1e3,
        )


class RequestState:
    """Turns sampled tokens of one sequence into TokenEvents and decides when it stops."""

    def __init__(
        self,
        seq: Sequence,
        tokenizer: Decoder | None,
        eos_token_ids: tuple[int, ...],
        arrival: float,
        resume: Resume | None = None,
    ) -> None:
        self.seq = seq
        options = seq.sampling
        self._stop_ids = frozenset(options.stop_token_ids) | (
            frozenset() if options.ignore_eos else frozenset(eos_token_ids)
        )
        self._stop_strings = options.stop_strings
        self._detok: IncrementalDetokenizer | None = None
        if tokenizer is not None and (options.detokenize or options.stop_strings):
            prompt = seq.token_ids[: seq.num_prompt_tokens]
            self._detok = IncrementalDetokenizer(tokenizer, prompt, skip_special_tokens=True)
        self._emit_text = options.detokenize
        # Text that might be the start of a stop string is held back until it cannot be.
        self._hold = max((len(s) for s in options.stop_strings), default=1) - 1
        self._pending = ""
        self.clock = _Clock(arrival)
        if resume is not None:
            self._resume(resume)

    def _resume(self, resume: Resume) -> None:
        """Decode the resumed tokens as if generated here; what of their text was not yet
        delivered is pending, exactly as the replica that produced them held it."""
        if self._detok is None:
            return
        text = "".join(self._detok.push(t) for t in resume.token_ids if t not in self._stop_ids)
        if resume.text_sent_chars > len(text):
            raise InvalidRequest(
                f"resume.text_sent_chars {resume.text_sent_chars} exceeds the {len(text)} "
                "characters its tokens decode to",
                "resume.text_sent_chars",
            )
        self._pending = text[resume.text_sent_chars :]

    @property
    def finished(self) -> bool:
        return self.seq.finish_reason is not None

    def mark_scheduled(self, now: float) -> None:
        if self.clock.first_scheduled is None:
            self.clock.first_scheduled = now

    def append(
        self,
        token_id: int,
        logprob: float | None,
        now: float,
        top_logprobs: tuple[TopToken, ...] | None = None,
    ) -> TokenEvent:
        """Record one sampled token and build its event (the last one carries finish data)."""
        seq = self.seq
        seq.token_ids.append(token_id)
        if self.clock.first_token is None:
            self.clock.first_token = now
        text, matched_stop_string = self._text_delta(token_id)
        reason = FinishReason.STOP if matched_stop_string else self._stop_reason(token_id)
        if reason is not None and not matched_stop_string:
            text += self._flush()
        options = seq.sampling
        wants_logprobs = options.logprobs or options.top_logprobs > 0
        logprobs = (logprob,) if wants_logprobs and logprob is not None else None
        top = (top_logprobs,) if options.top_logprobs > 0 and top_logprobs is not None else None
        return self._event((token_id,), text, logprobs, reason, now, top)

    def finish_without_token(self, reason: FinishReason, now: float) -> TokenEvent:
        """Final event for a request ended outside sampling (cancelled, failed)."""
        return self._event((), "", None, reason, now)

    def _stop_reason(self, token_id: int) -> FinishReason | None:
        seq = self.seq
        if token_id in self._stop_ids:
            return FinishReason.STOP
        if seq.num_completion_tokens >= seq.max_completion_tokens:
            return FinishReason.LENGTH
        return None

    def _text_delta(self, token_id: int) -> tuple[str, bool]:
        """Text released by this token, and whether a stop string matched."""
        if self._detok is None or token_id in self._stop_ids:
            return "", False  # a stop token's own text is never part of the output
        self._pending += self._detok.push(token_id)
        index = _first_match(self._pending, self._stop_strings)
        if index >= 0:
            text = self._pending[:index]
            self._pending = ""
            return (text if self._emit_text else ""), True
        cut = len(self._pending) - self._hold
        if cut <= 0:
            return "", False
        text, self._pending = self._pending[:cut], self._pending[cut:]
        return (text if self._emit_text else ""), False

    def _flush(self) -> str:
        if self._detok is None:
            return ""
        text = self._pending + self._detok.finish()
        self._pending = ""
        index = _first_match(text, self._stop_strings)
        if index >= 0:
            text = text[:index]
        return text if self._emit_text else ""

    def _event(
        self,
        token_ids: tuple[int, ...],
        text: str,
        logprobs: tuple[float, ...] | None,
        reason: FinishReason | None,
        now: float,
        top_logprobs: tuple[tuple[TopToken, ...], ...] | None = None,
    ) -> TokenEvent:
        seq = self.seq
        if reason is not None:
            seq.finish_reason = reason
            self.clock.finished = now
        return TokenEvent(
            token_ids=token_ids,
            text_delta=text,
            logprobs=logprobs,
            finish_reason=reason,
            prompt_tokens=seq.num_prompt_tokens,
            completion_tokens=seq.num_completion_tokens,
            cached_tokens=min(seq.num_cached_tokens, seq.num_prompt_tokens),
            timings=self.clock.timings() if reason is not None else None,
            top_logprobs=top_logprobs,
        )


def _first_match(text: str, stops: tuple[str, ...]) -> int:
    """Index of the earliest stop string in text, or -1."""
    found = [i for i in (text.find(stop) for stop in stops) if i >= 0]
    return min(found, default=-1)
