"""Incremental detokenization: token ids in, text deltas out, never a broken UTF-8 character.

The technique of vLLM and TGI: decode a short window `ids[prefix_offset:]` and subtract the
text of `ids[prefix_offset:read_offset]` (the part already emitted). Decoding a window instead
of a single token keeps decoders that treat a sequence's first token specially (Metaspace's
leading space) consistent, and lets a character spread over several byte-level tokens appear
only once its last byte has arrived. While the window's text ends in U+FFFD, the tail is an
incomplete byte sequence and is held back.

A character spans at most 4 bytes, hence at most 4 byte-level tokens; a tail held back for
MAX_HELD_TOKENS tokens is invalid bytes, not an incomplete character, and is emitted with its
U+FFFD. This bounds the decode window when a model generates garbage bytes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"
# Tokens of the prompt kept in the first window, so the first generated token decodes in context.
INITIAL_CONTEXT_TOKENS = 5
MAX_HELD_TOKENS = 16


class Decoder(Protocol):
    """What the detokenizer needs from a tokenizer (tokenizers.Tokenizer fits)."""

    def decode(self, ids: Sequence[int], /, skip_special_tokens: bool = ...) -> str: ...


class IncrementalDetokenizer:
    """Turns a growing stream of token ids into text deltas; one instance per sequence.

    `prompt_ids` give context only: their text is never emitted.
    """

    def __init__(
        self,
        decoder: Decoder,
        prompt_ids: Sequence[int] = (),
        *,
        skip_special_tokens: bool = False,
    ) -> None:
        self._decoder = decoder
        self._skip_special = skip_special_tokens
        self._ids: list[int] = list(prompt_ids)
        self._prefix_offset = max(len(self._ids) - INITIAL_CONTEXT_TOKENS, 0)
        self._read_offset = len(self._ids)
        self._text: list[str] = []

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return "".join(self._text)

    @property
    def token_ids(self) -> list[int]:
        """Prompt and generated ids fed so far."""
        return list(self._ids)

    def push(self, token_id: int) -> str:
        """Feed one token; return the new complete text (maybe empty)."""
        self._ids.append(token_id)
        return self._advance()

    def extend(self, token_ids: Iterable[int]) -> str:
        """Feed several tokens; return their combined delta."""
        return "".join(self.push(token_id) for token_id in token_ids)

    def finish(self) -> str:
        """Flush the held-back tail at the end of the stream (may contain U+FFFD)."""
        prefix_text, new_text = self._decode_window()
        self._prefix_offset = self._read_offset = len(self._ids)
        return self._emit(new_text[len(prefix_text) :])

    def _advance(self) -> str:
        prefix_text, new_text = self._decode_window()
        if len(new_text) <= len(prefix_text):
            return ""
        # An incomplete UTF-8 tail decodes to U+FFFD: wait for the bytes that complete it.
        held = len(self._ids) - self._read_offset
        if new_text.endswith(REPLACEMENT_CHAR) and held < MAX_HELD_TOKENS:
            return ""
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return self._emit(new_text[len(prefix_text) :])

    def _decode_window(self) -> tuple[str, str]:
        window = self._ids[self._prefix_offset :]
        prefix_len = self._read_offset - self._prefix_offset
        prefix_text = self._decode(window[:prefix_len]) if prefix_len else ""
        return prefix_text, self._decode(window)

    def _decode(self, ids: Sequence[int]) -> str:
        return self._decoder.decode(ids, skip_special_tokens=self._skip_special)

    def _emit(self, delta: str) -> str:
        if delta:
            self._text.append(delta)
        return delta
