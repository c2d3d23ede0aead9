"""The failed-authentication throttle's buckets: limit, drain, retry time and memory bound."""

from __future__ import annotations

import pytest

from llm_auth.failure_throttle import FailureThrottle, LeakyCounters, ThrottleSettings

pytestmark = pytest.mark.security


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_limit_failures_then_a_wait_that_drains() -> None:
    clock = Clock()
    counters = LeakyCounters(ThrottleSettings(limit=4, window_s=60.0), clock)
    for _ in range(3):
        counters.add("a")
        assert counters.wait_s("a") == 0
    counters.add("a")  # the 4th failure within the window
    assert counters.wait_s("a") == pytest.approx(15.0)  # one failure drains in 60/4 s
    clock.now += 15.0
    assert counters.wait_s("a") == 0
    assert counters.wait_s("never-failed") == 0


def test_a_refused_address_stays_refused_one_interval_after_each_attempt() -> None:
    clock = Clock()
    throttle = FailureThrottle(ThrottleSettings(limit=4, window_s=60.0), clock)
    for _ in range(4):
        throttle.failed("203.0.113.7", None)
    clock.now += 14.9  # the 4th failure has almost drained: barely over the limit
    assert throttle.address_wait_s("203.0.113.7") == pytest.approx(15.0)  # held from now
    clock.now += 14.0  # still hammering inside the interval: still refused, held again
    assert throttle.address_wait_s("203.0.113.7") == pytest.approx(15.0)
    clock.now += 15.0  # quiet for one interval: one more guess is allowed
    assert throttle.address_wait_s("203.0.113.7") == 0
    assert throttle.address_wait_s("198.51.100.1") == 0


def test_tables_are_bounded_least_recent_first() -> None:
    counters = LeakyCounters(ThrottleSettings(limit=1, window_s=60.0, max_tracked=3), Clock())
    for key in ("a", "b", "c", "a", "d"):
        counters.add(key)
    assert len(counters) == 3
    assert counters.wait_s("b") == 0  # evicted: the least recently failed
    assert counters.wait_s("a") > 0


def test_unknown_addresses_share_no_bucket_and_key_ids_report_prior_throttling() -> None:
    throttle = FailureThrottle(ThrottleSettings(limit=2, window_s=60.0), Clock())
    for _ in range(5):
        throttle.failed("", None)
    assert throttle.address_wait_s("") == 0
    assert [throttle.failed("", "k") for _ in range(3)][:2] == [0.0, 0.0]
    assert throttle.failed("", "k") > 0


def test_disabled_records_nothing() -> None:
    throttle = FailureThrottle(ThrottleSettings(limit=0))
    for _ in range(10):
        assert throttle.failed("203.0.113.7", "k") == 0
    assert throttle.address_wait_s("203.0.113.7") == 0
    assert len(throttle.addresses) == 0
