"""Recently tokenized prompts, so an identical request skips the tokenizer round trip.

Exact repeats are common where it matters most: cache hits, client retries, popular prompts.
Entries are scoped per tenant (a shared memo would let one tenant time another's prompts),
bounded by the number of token ids held, and expire so a redeployed tokenizer takes over.
"""

from __future__ import annotations

import hashlib
import time
from array import array
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from llm_common.bounded_map import BoundedTTLMap


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
        # 4 bytes an id ("i"): vocabularies stay far below 2**31.
        self._entries: BoundedTTLMap[bytes, array[int]] = BoundedTTLMap(
            max_weight=settings.max_tokens, weigh=len, ttl_s=settings.ttl_s, clock=clock
        )

    @property
    def held_tokens(self) -> int:
        return self._entries.weight

    def get(self, key: bytes) -> list[int] | None:
        ids = self._entries.get(key)
        return None if ids is None else ids.tolist()

    def put(self, key: bytes, ids: list[int]) -> None:
        self._entries.put(key, array("i", ids))

    def clear(self) -> None:
        self._entries.clear()
