"""Recently tokenized prompts, so an identical request skips the tokenizer round trip.

Exact repeats are common where it matters most: cache hits, client retries, popular prompts.
Entries are scoped per tenant (a shared memo would let one tenant time another's prompts),
bounded by the number of token ids held, and expire so a redeployed tokenizer takes over.
"""

from __future__ import annotations

import hashlib
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MemoSettings:
    """`max_tokens` token ids in all (0 turns the memo off), each entry kept `ttl_s`."""

    max_tokens: int = 2_000_000  # about 8 MiB of ids
    ttl_s: float = 300.0


def memo_key(parts: Iterable[bytes]) -> bytes:
    """A fixed-size key of length-prefixed parts (no two part lists share one)."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()


class TokenMemo:
    """An LRU of token ids by key, bounded in ids held and entry age."""

    def __init__(
        self, settings: MemoSettings, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._entries: OrderedDict[bytes, tuple[float, array[int]]] = OrderedDict()
        self._held = 0

    @property
    def held_tokens(self) -> int:
        return self._held

    def get(self, key: bytes) -> list[int] | None:
        found = self._entries.get(key)
        if found is None:
            return None
        expires, ids = found
        if self._clock() >= expires:
            self._drop(key)
            return None
        self._entries.move_to_end(key)
        return ids.tolist()

    def put(self, key: bytes, ids: list[int]) -> None:
        if len(ids) > self._settings.max_tokens:
            return
        if key in self._entries:
            self._drop(key)
        # 4 bytes an id ("i"): vocabularies stay far below 2**31.
        self._entries[key] = (self._clock() + self._settings.ttl_s, array("i", ids))
        self._held += len(ids)
        while self._held > self._settings.max_tokens:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        self._entries.clear()
        self._held = 0

    def _drop(self, key: bytes) -> None:
        _, ids = self._entries.pop(key)
        self._held -= len(ids)
