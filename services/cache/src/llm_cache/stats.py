"""Per-tenant hit and store counters since the process started (Stats RPC)."""

from __future__ import annotations

from dataclasses import dataclass, fields

MAX_TRACKED_TENANTS = 100_000  # beyond this, new tenants count only towards the totals


@dataclass(slots=True)
class Counters:
    """Event counts of one tenant (or all of them)."""

    lookups: int = 0
    exact_hits: int = 0
    semantic_hits: int = 0
    misses: int = 0
    stores: int = 0
    dropped_stores: int = 0
    evictions: int = 0
    guard_rejections: int = 0
    near_hits: int = 0  # exact hits callers served from their own copies (RecordHits)

    def add(self, other: Counters) -> None:
        for name in _NAMES:  # fields() on every call cost more than the additions (hot path)
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def copy(self) -> Counters:
        return Counters(**{name: getattr(self, name) for name in _NAMES})


_NAMES = tuple(f.name for f in fields(Counters))


class Stats:
    """Counters by tenant id plus a running total. Event-loop only (no locking)."""

    def __init__(self, max_tenants: int = MAX_TRACKED_TENANTS) -> None:
        self._max_tenants = max_tenants
        self._tenants: dict[str, Counters] = {}
        self._total = Counters()

    def record(self, tenant: str, event: Counters) -> None:
        """Add `event` to the tenant's counters and to the total."""
        self._total.add(event)
        counters = self._tenants.get(tenant)
        if counters is None:
            if len(self._tenants) >= self._max_tenants:
                return
            counters = self._tenants[tenant] = Counters()
        counters.add(event)

    def snapshot(self, tenant: str | None) -> Counters:
        """A copy of one tenant's counters, or of the total when `tenant` is None."""
        if tenant is None:
            return self._total.copy()
        counters = self._tenants.get(tenant)
        return counters.copy() if counters is not None else Counters()
