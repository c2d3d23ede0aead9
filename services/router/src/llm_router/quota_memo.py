"""Keys without a tokens-per-minute limit, remembered so their requests skip auth.

For such a key, auth's ReserveTokens holds nothing and there is nothing to refund: two calls
per request that only cost CPU and a hop. Auth says so in its answer (limit 0, enforced), and
the router then skips the quota for that key for `ttl_s`. A limit set on the key (or on its
tenant) meanwhile takes effect when the entry expires: within `ttl_s`, as auth's own cache of
verified keys delays a revocation.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class UnlimitedKeys:
    """(tenant, key) pairs auth reported unlimited, each for `ttl_s`; at most `max_entries`
    (a full memo is emptied: it only saves calls)."""

    def __init__(
        self,
        ttl_s: float,
        max_entries: int = 100_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        self._clock = clock
        self._until: dict[tuple[str, str], float] = {}

    def __contains__(self, key: tuple[str, str]) -> bool:
        until = self._until.get(key)
        if until is None:
            return False
        if self._clock() < until:
            return True
        del self._until[key]
        return False

    def remember(self, tenant_id: str, key_id: str) -> None:
        if self._ttl_s <= 0:
            return
        if len(self._until) >= self._max_entries:
            self._until.clear()
        self._until[(tenant_id, key_id)] = self._clock() + self._ttl_s
