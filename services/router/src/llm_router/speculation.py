"""When to start generation before the cache has answered.

Waiting for the lookup saves a replica's prefill on a hit but adds the lookup's latency to
every miss. Which is worth it depends on how often lookups hit, so the router tracks the
recent hit rate and starts generation at once (cancelling it on a hit) while hits are rare.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class HitRate:
    """An exponentially weighted hit rate over roughly the last 1/`alpha` lookups."""

    alpha: float = 0.05
    value: float = 0.0
    _seen: int = field(default=0, repr=False)

    def observe(self, hit: bool) -> None:
        # A plain mean until 1/alpha lookups are in, so the first hits count at full weight.
        self._seen += 1
        weight = max(self.alpha, 1.0 / self._seen)
        self.value += weight * ((1.0 if hit else 0.0) - self.value)


@dataclass(slots=True)
class Speculation:
    """Start generation alongside the lookup while the hit rate is below `below_hit_rate`
    (0 never speculates: generation always waits up to the lookup grace)."""

    below_hit_rate: float
    hits: HitRate = field(default_factory=HitRate)

    def dispatch_early(self) -> bool:
        return self.hits.value < self.below_hit_rate
