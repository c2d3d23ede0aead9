"""When to start generation before the cache has answered.

Waiting for the lookup saves a replica's prefill on a hit but adds the lookup's latency to
every miss. Which is worth it depends on how often lookups hit, so the router tracks the
recent hit rate and starts generation at once (cancelling it on a hit) while hits are rare.

While hits are common, generation waits for the lookup for a grace period. A fixed grace
fails under load: lookups slow down with everything else, outlast the grace, and every hit
then costs a replica prefill that is thrown away, which adds load exactly where there is none
to spare (a probe at 16 concurrent hits on a busy host: 333 of 896 hits started a generation).
So the grace follows the recent lookup latency, between the configured floor and a cap.
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


GRACE_LATENCY_FACTOR = 3.0  # wait this many recent lookup latencies...
GRACE_CAP_S = 0.5  # ...but never longer: a stalled cache must not stall every miss


@dataclass(slots=True)
class Latency:
    """An exponentially weighted mean of recent lookup latencies, in seconds."""

    alpha: float = 0.1
    value: float = 0.0

    def observe(self, seconds: float) -> None:
        self.value = (
            seconds if self.value == 0.0 else self.value + self.alpha * (seconds - self.value)
        )


@dataclass(slots=True)
class Speculation:
    """Start generation alongside the lookup while the hit rate is below `below_hit_rate`
    (0 never speculates: generation always waits up to the lookup grace)."""

    below_hit_rate: float
    hits: HitRate = field(default_factory=HitRate)
    latency: Latency = field(default_factory=Latency)

    def dispatch_early(self) -> bool:
        return self.hits.value < self.below_hit_rate

    def grace_s(self, floor_s: float) -> float:
        """How long generation waits for the lookup: `floor_s`, or a few recent lookup
        latencies when lookups are slower than that, up to the cap. A floor of 0 never waits."""
        if floor_s <= 0.0:
            return 0.0
        adaptive = min(GRACE_LATENCY_FACTOR * self.latency.value, GRACE_CAP_S)
        return max(floor_s, adaptive)
