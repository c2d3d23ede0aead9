"""The outage cache: TTL, max age and LRU bound."""

from __future__ import annotations

from llm_auth.ttl_cache import TtlCache


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_entries_expire_after_the_ttl() -> None:
    clock = Clock()
    cache = TtlCache[str, int](ttl_s=30, max_entries=10, clock=clock)
    cache.put("a", 1)
    clock.now = 29.9
    assert cache.get("a") == 1
    clock.now = 30.0
    assert cache.get("a") is None
    assert len(cache) == 0


def test_max_age_is_stricter_than_the_ttl() -> None:
    clock = Clock()
    cache = TtlCache[str, int](ttl_s=30, max_entries=10, clock=clock)
    cache.put("a", 1)
    clock.now = 6
    assert cache.get("a", max_age_s=5) is None
    assert cache.get("a") == 1


def test_least_recently_used_entries_go_first() -> None:
    cache = TtlCache[str, int](ttl_s=30, max_entries=2, clock=Clock())
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert cache.get("b") is None
    assert (cache.get("a"), cache.get("c")) == (1, 3)
    cache.pop("a")
    assert cache.get("a") is None
