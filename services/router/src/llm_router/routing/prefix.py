"""Prefix-cache affinity: chained hashes of leading prompt blocks → the replica that has them."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from llm_common.bounded_map import BoundedTTLMap


@dataclass(frozen=True, slots=True)
class _Placement:
    """Which replica last received a block, and when (the clock's time)."""

    replica: str
    at: float


def prefix_chain(
    tokens: Sequence[int], *, block_tokens: int, max_blocks: int, salt: str
) -> tuple[int, ...]:
    """Chained hashes of the leading full blocks: h_k = hash(h_{k-1}, block_k).

    Like the engines' prefix caches, only full blocks count and block k's hash depends on every
    token before it, so equal hashes mean equal prefixes. `salt` keeps deployments apart.
    Python's hash differs between processes, which suits a table that lives in one process.
    """
    chain: list[int] = []
    previous = hash(salt)
    blocks = min(len(tokens) // block_tokens, max_blocks)
    for k in range(blocks):
        previous = hash((previous, *tokens[k * block_tokens : (k + 1) * block_tokens]))
        chain.append(previous)
    return tuple(chain)


class AffinityTable:
    """Which replica most recently received each block hash; bounded LRU with a TTL.

    Approximate by design (the llm-d `prefix-cache-scorer` idea): it remembers routing
    decisions, not the replicas' actual KV contents, so a replica that evicted a prefix still
    looks warm until the entry expires.
    """

    def __init__(
        self,
        *,
        max_entries: int,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # No TTL in the map: an expired placement still counts in its replica's footprint
        # until it is evicted or replaced, and `matches` skips it by age.
        self._entries: BoundedTTLMap[int, _Placement] = BoundedTTLMap(
            max_entries, on_evict=self._evicted, clock=clock
        )
        self._footprint: Counter[str] = Counter()
        self._ttl_s = ttl_s
        self._clock = clock

    def __len__(self) -> int:
        return len(self._entries)

    def matches(self, chain: Sequence[int], replicas: Sequence[str]) -> dict[str, int]:
        """For each of `replicas` seen on this prefix: how many leading blocks it holds."""
        wanted = set(replicas)
        found: dict[str, int] = {}
        now = self._clock()
        # Deepest first: a replica's longest match is the first hit naming it.
        for depth in range(len(chain), 0, -1):
            entry = self._entries.peek(chain[depth - 1])
            if entry is None or now - entry.at > self._ttl_s:
                continue
            replica = entry.replica
            if replica in wanted and replica not in found:
                found[replica] = depth
                if len(found) == len(wanted):
                    break
        return found

    def footprint(self, replica: str) -> int:
        """Blocks remembered on `replica`: how much of the prefix working set it holds."""
        return self._footprint[replica]

    def record(self, chain: Sequence[int], replica: str) -> None:
        """`replica` now holds every block of `chain` (the request was sent there)."""
        now = self._clock()
        for block_hash in chain:
            previous = self._entries.peek(block_hash)
            if previous is not None:
                self._footprint[previous.replica] -= 1
            self._footprint[replica] += 1
            self._entries.put(block_hash, _Placement(replica, now))

    def forget(self, replica: str) -> None:
        """Drop every entry of `replica` (it restarted or was removed: its cache is cold)."""
        stale = [h for h, entry in self._entries.items() if entry.replica == replica]
        for block_hash in stale:
            self._entries.pop(block_hash)
        self._footprint.pop(replica, None)

    def _evicted(self, _block_hash: int, placement: _Placement) -> None:
        self._footprint[placement.replica] -= 1
