"""Caller text tokenized as text: special-token strings typed in a request stay characters.

HF's apply_chat_template renders the conversation and encodes the whole prompt with special-token
parsing, so `<|eos|>` typed inside a message becomes the real eos id and forges a turn (issue 32,
finding 1). Here only the template's own special tokens get special ids:

1. every string the request gives the template (contents, names, tool calls, tool definitions,
   dict keys included) has its special-token text swapped for a marker carrying a per-call
   random nonce, which no caller can predict or type;
2. the template renders; what it writes itself is the only special-token text left;
3. the prompt is split at that text (its ids), the markers are turned back into the caller's
   text and the pieces between are encoded by a copy of the tokenizer that parses no special
   tokens (`encode_special_tokens`).

A request with no special-token text anywhere takes the plain path: one encode of the rendered
prompt, the same ids HF returns. The split path matches them too for byte-level tokenizers (the
tokenizer itself splits at special tokens before anything else); a Metaspace tokenizer that
prepends "▁" only at the very start may differ at a piece's first token, only in requests that
carried special-token text. Added tokens marked non-special (Qwen's `<tool_call>`) are ordinary
vocabulary to HF and stay so here.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from typing import Any

from tokenizers import Tokenizer


@dataclass(frozen=True, slots=True)
class Shielded:
    """Template variables with special-token text replaced; `markers` maps each marker back."""

    data: Any
    markers: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class LiteralText:
    """A tokenizer's special tokens and a copy of it that encodes them as plain text."""

    literal: Tokenizer  # encode_special_tokens set: special-token text is text
    ids: Mapping[str, int]  # special-token text -> id
    lstrip: frozenset[str]  # tokens that absorb whitespace on their left
    rstrip: frozenset[str]  # ... and on their right
    pattern: re.Pattern[str] | None = field(default=None)  # any special-token text

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> LiteralText:
        literal = Tokenizer.from_str(tokenizer.to_str())
        literal.encode_special_tokens = True
        decoder = tokenizer.get_added_tokens_decoder()
        specials = [t for t in decoder.values() if t.special]
        ids = {t.content: i for i, t in decoder.items() if t.special}
        pattern = re.compile(_trie_pattern(ids)) if ids else None
        return cls(
            literal=literal,
            ids=ids,
            lstrip=frozenset(t.content for t in specials if t.lstrip),
            rstrip=frozenset(t.content for t in specials if t.rstrip),
            pattern=pattern,
        )

    def encode_batch(self, texts: list[str], *, add_special_tokens: bool) -> list[list[int]]:
        """Ids per text, special-token text encoded as characters (BOS still added if asked)."""
        encodings = self.literal.encode_batch_fast(texts, add_special_tokens=add_special_tokens)
        return [encoding.ids for encoding in encodings]

    def shield(self, data: Any) -> Shielded:
        """`data` (template variables) with every special-token string swapped for a marker."""
        if self.pattern is None:
            return Shielded(data, {})
        nonce = secrets.token_hex(8)
        markers: dict[str, str] = {}

        pattern = self.pattern

        def marker(match: re.Match[str]) -> str:
            key = f"[{nonce}:{self.ids[match.group()]}]"
            markers[key] = match.group()
            return key

        return Shielded(_map_strings(data, lambda s: pattern.sub(marker, s)), markers)

    def encode_rendered(self, rendered: str, markers: Mapping[str, str]) -> tuple[str, list[int]]:
        """(prompt, ids) of a template's output over shielded data: the special-token text
        left is the template's own; the markers go back to the caller's text, encoded as text."""
        assert self.pattern is not None  # markers exist only where special tokens do
        restore = re.compile("|".join(map(re.escape, markers)))
        pieces = self.pattern.split(rendered)
        tokens = self.pattern.findall(rendered)
        pieces = _strip_around(pieces, tokens, self.lstrip, self.rstrip)
        texts = [restore.sub(lambda m: markers[m.group()], piece) for piece in pieces]
        encoded = self.encode_batch(texts, add_special_tokens=False)
        ids: list[int] = list(encoded[0])
        for token, piece_ids in zip(tokens, encoded[1:], strict=True):
            ids.append(self.ids[token])
            ids.extend(piece_ids)
        return restore.sub(lambda m: markers[m.group()], rendered), ids


def _trie_pattern(words: Iterable[str]) -> str:
    """A regex matching any of `words` leftmost-longest, as the tokenizer matches added tokens.

    Built as a trie (shared prefixes factored out): a plain alternation tries every word at
    every `<|` of the text, which made adversarial text (`<|x <|x ...`) with Llama-3's 256
    special tokens ~20x slower to scan than this.
    """
    root: dict[str, Any] = {}
    for word in words:
        node = root
        for char in word:
            node = node.setdefault(char, {})
        node[""] = {}  # a word ends here

    def build(node: dict[str, Any]) -> str:
        branches = [re.escape(c) + build(child) for c, child in sorted(node.items()) if c]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        # Where a word ends but longer ones go on: the greedy `?` tries the longer first.
        return f"(?:{body})?" if "" in node else body

    return build(root)


def _map_strings(value: Any, func: Callable[[str], str]) -> Any:
    """`value` with func applied to every string in it, dict keys and dataclass fields included."""
    if isinstance(value, str):
        return func(value)
    if is_dataclass(value) and not isinstance(value, type):
        changes = {f.name: _map_strings(getattr(value, f.name), func) for f in fields(value)}
        return replace(value, **changes)
    if isinstance(value, Mapping):
        return {_map_strings(k, func): _map_strings(v, func) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_map_strings(v, func) for v in value)
    return value


def _strip_around(
    pieces: list[str], tokens: list[str], lstrip: frozenset[str], rstrip: frozenset[str]
) -> list[str]:
    """Whitespace a special token absorbs (its lstrip/rstrip flags) dropped from its neighbours."""
    out = list(pieces)
    for i, token in enumerate(tokens):
        if token in lstrip:
            out[i] = out[i].rstrip()
        if token in rstrip:
            out[i + 1] = out[i + 1].lstrip()
    return out
