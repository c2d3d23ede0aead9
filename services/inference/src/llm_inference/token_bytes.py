"""Raw bytes of every token id, for logprobs' `bytes` fields (built once at start-up).

A token can hold part of a UTF-8 character; decoding it alone gives U+FFFD, so its bytes come
from the vocabulary instead: byte-level BPE pieces through the inverse of GPT-2's
bytes_to_unicode, byte-fallback pieces like <0xE2> as that byte, SentencePiece's U+2581 as a
space, added tokens as their text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer

_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_SPIECE_SPACE = "\u2581"


@dataclass(frozen=True, slots=True)
class TokenBytes:
    """Per token id (the index), its raw bytes; ids outside the vocabulary have none."""

    table: tuple[bytes, ...]

    def of(self, token_id: int) -> bytes:
        return self.table[token_id] if 0 <= token_id < len(self.table) else b""

    def text(self, token_id: int) -> str:
        """The token as text; a partial UTF-8 sequence shows as U+FFFD."""
        return self.of(token_id).decode("utf-8", errors="replace")


def token_bytes_table(tokenizer: Tokenizer) -> TokenBytes:
    """Every id's raw bytes, by how the tokenizer spells pieces (see the module docstring)."""
    config: dict[str, Any] = json.loads(tokenizer.to_str())
    spell = _speller(config, tokenizer)
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    table = [b""] * (max(vocab.values(), default=-1) + 1)
    for piece, token_id in vocab.items():
        table[token_id] = spell(piece, token_id)
    for token_id, added in tokenizer.get_added_tokens_decoder().items():
        table[token_id] = added.content.encode("utf-8")  # added tokens are literal text
    return TokenBytes(tuple(table))


class _Speller:
    """Turns one vocabulary piece into bytes for one tokenizer family."""

    def __init__(self, tokenizer: Tokenizer, *, byte_level: bool, sentencepiece: bool) -> None:
        self._tokenizer = tokenizer
        self._byte_level = byte_level
        self._sentencepiece = sentencepiece
        self._byte_of = {char: byte for byte, char in _bytes_to_unicode().items()}

    def __call__(self, piece: str, token_id: int) -> bytes:
        if self._byte_level and all(char in self._byte_of for char in piece):
            return bytes(self._byte_of[char] for char in piece)
        if self._sentencepiece:
            match = _BYTE_FALLBACK.fullmatch(piece)
            if match:
                return bytes([int(match.group(1), 16)])
            return piece.replace(_SPIECE_SPACE, " ").encode("utf-8")
        # Other families (WordPiece, ...) have no partial characters: the decoder's text is exact.
        return self._tokenizer.decode([token_id], skip_special_tokens=False).encode("utf-8")


def _speller(config: dict[str, Any], tokenizer: Tokenizer) -> _Speller:
    decoder, pre_tokenizer = config.get("decoder"), config.get("pre_tokenizer")
    model = config.get("model") or {}
    return _Speller(
        tokenizer,
        byte_level=_has_type(decoder, "ByteLevel") or _has_type(pre_tokenizer, "ByteLevel"),
        sentencepiece=bool(model.get("byte_fallback"))
        or _has_type(decoder, "ByteFallback")
        or _has_type(decoder, "Metaspace")
        or _has_type(pre_tokenizer, "Metaspace"),
    )


def _has_type(component: Any, type_name: str) -> bool:
    """Whether a tokenizer.json component, or any part of a Sequence of them, is `type_name`."""
    if isinstance(component, dict):
        if component.get("type") == type_name:
            return True
        return any(_has_type(value, type_name) for value in component.values())
    if isinstance(component, list):
        return any(_has_type(item, type_name) for item in component)
    return False


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from each byte to the printable character byte-level BPE spells it with."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = {byte: chr(byte) for byte in printable}
    shifted = [byte for byte in range(256) if byte not in chars]
    for offset, byte in enumerate(shifted):
        chars[byte] = chr(256 + offset)
    return chars
