"""The hit-rate rule that decides whether generation starts before the cache answers."""

from __future__ import annotations

import pytest

from llm_router.cache.speculation import GRACE_CAP_S, HitRate, Latency, Speculation


def test_first_lookups_count_at_full_weight() -> None:
    rate = HitRate(alpha=0.05)
    rate.observe(True)
    assert rate.value == 1.0
    rate.observe(False)
    assert rate.value == pytest.approx(0.5)


def test_rate_follows_the_recent_window() -> None:
    rate = HitRate(alpha=0.05)
    for _ in range(200):
        rate.observe(True)
    assert rate.value == pytest.approx(1.0)
    for _ in range(60):  # three windows of misses wash the hits out
        rate.observe(False)
    assert rate.value < 0.05


def test_speculates_only_while_hits_are_rare() -> None:
    speculation = Speculation(below_hit_rate=0.2)
    assert speculation.dispatch_early()  # nothing seen yet: a miss is the likely answer
    for _ in range(10):
        speculation.hits.observe(True)
    assert not speculation.dispatch_early()
    for _ in range(100):
        speculation.hits.observe(False)
    assert speculation.dispatch_early()


def test_zero_threshold_never_speculates() -> None:
    assert not Speculation(below_hit_rate=0.0).dispatch_early()


def test_latency_is_a_moving_mean_that_starts_at_the_first_sample() -> None:
    latency = Latency(alpha=0.1)
    latency.observe(0.02)
    assert latency.value == 0.02
    for _ in range(100):
        latency.observe(0.2)
    assert 0.19 < latency.value <= 0.2


def test_grace_follows_slow_lookups_between_floor_and_cap() -> None:
    speculation = Speculation(below_hit_rate=0.2)
    assert speculation.grace_s(0.05) == 0.05  # no lookups seen: the floor
    speculation.latency.observe(0.004)
    assert speculation.grace_s(0.05) == 0.05  # fast lookups: the floor
    speculation.latency = Latency(value=0.06)
    assert speculation.grace_s(0.05) == pytest.approx(0.18)  # a loaded host: 3 latencies
    speculation.latency = Latency(value=5.0)
    assert speculation.grace_s(0.05) == GRACE_CAP_S  # a stalled cache: capped
    assert speculation.grace_s(0.0) == 0.0  # floor 0: never wait
