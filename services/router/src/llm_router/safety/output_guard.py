"""The streaming output guard: a hold-back window so that blocked phrases and personal data
split across deltas are still caught before any of it reaches the client."""

from __future__ import annotations

import re
from dataclasses import dataclass

from llm_router.safety import pii
from llm_router.safety.policies import OutputPolicy

# The text a piece of personal data still being generated can end with: a run of digits
# grouped by single spaces/dashes (a card), then any non-space characters (an address).
_OPEN_TAIL = re.compile(r"(?:\d[ -]?)*\S*\Z")


@dataclass(frozen=True, slots=True)
class GuardResult:
    """What may be sent now, and whether the stream must stop (a blocked phrase)."""

    text: str
    blocked: bool = False
    rule: str = ""  # the blocked phrase's rule id
    redacted: tuple[str, ...] = ()  # PII kinds replaced in `text`


class StreamGuard:
    """Feeds on text deltas, releases text only once no rule can still match across it.

    Held back: the last `hold_back_chars` characters (a phrase may be completing there) and
    any unfinished e-mail address or card number at the end (up to pii.MAX_FINDING_CHARS).
    A phrase match touching the end of the held text is not final until more text (or the
    end of the stream) shows the word does not go on.
    """

    def __init__(self, policy: OutputPolicy) -> None:
        self._policy = policy
        self._buffer = ""
        self._before = ""  # the last character already released, for word boundaries
        self._stopped = False

    @property
    def pending(self) -> str:
        """Text received but not released yet."""
        return self._buffer

    def feed(self, delta: str) -> GuardResult:
        """Take a delta; return the text that is now safe to release."""
        if self._stopped:
            return GuardResult("", blocked=True)
        self._buffer += delta
        blocked = self._blocked(final=False)
        if blocked is not None:
            return blocked
        cut = self._safe_cut()
        return self._release(cut)

    def finish(self) -> GuardResult:
        """The stream ended: release everything left unless it completes a blocked phrase."""
        if self._stopped:
            return GuardResult("", blocked=True)
        blocked = self._blocked(final=True)
        if blocked is not None:
            return blocked
        return self._release(len(self._buffer))

    def _blocked(self, *, final: bool) -> GuardResult | None:
        text = self._before + self._buffer
        offset = len(self._before)
        for rule in self._policy.phrases:
            for match in rule.pattern.finditer(text):
                if match.end() <= offset:
                    continue
                if match.end() == len(text) and not final:
                    continue  # the word may go on in the next delta
                self._stopped = True
                released = self._release(max(0, match.start() - offset))
                return GuardResult(released.text, True, rule.id, released.redacted)
        return None

    def _safe_cut(self) -> int:
        size = len(self._buffer)
        tail = _OPEN_TAIL.search(self._buffer)
        open_chars = min(size - tail.start() if tail else 0, pii.MAX_FINDING_CHARS)
        hold = max(self._policy.hold_back_chars, open_chars if self._policy.redact else 0)
        cut = max(0, size - hold)
        # Never cut through a finding: it would be released half-redacted.
        for finding in pii.find(self._buffer, self._policy.redact):
            if finding.start < cut < finding.end:
                return finding.start
        return cut

    def _release(self, cut: int) -> GuardResult:
        if cut <= 0:
            return GuardResult("")
        head, self._buffer = self._buffer[:cut], self._buffer[cut:]
        self._before = head[-1]
        text, kinds = pii.redact(head, self._policy.redact)
        return GuardResult(text, redacted=kinds)
