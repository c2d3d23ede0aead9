"""Callers with no limit to check, remembered so their requests skip a reservation call.

For a key without a tokens-per-minute limit, auth's ReserveTokens holds nothing and there is
nothing to refund: two calls per request that only cost CPU and a hop. Auth says so in its
answer (limit 0, enforced), and the router then skips the quota for that (tenant, key) for
`ttl_s`. Likewise billing's Reserve says when no budget applies (`unbudgeted`): the router
then skips Reserve for that (tenant, key, model) and settles without a reservation, which
records the usage all the same. A limit or budget set meanwhile takes effect when the entry
expires: within `ttl_s`, as auth's own cache of verified keys delays a revocation.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class UnlimitedKeys:
    """Callers (tuples such as (tenant, key)) reported unlimited, each for `ttl_s`; at most
    `max_entries` (a full memo is emptied: it only saves calls)."""

    def __init__(
        self,
        ttl_s: float,
        max_entries: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._clock = clock
        self._until: dict[tuple[str, ...], float] = {}

    def __contains__(self, key: tuple[str, ...]) -> bool:
        until = self._until.get(key)
        if until is None:
            return False
        if self._clock() < until:
            return True
        del self._until[key]
        return False

    def remember(self, *key: str) -> None:
        if self._ttl_s <= 0:
            return
        if len(self._until) >= self._max_entries:
            self._until.clear()
        self._until[key] = self._clock() + self._ttl_s
