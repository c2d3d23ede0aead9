"""NearCache: served only while the feed is live, dropped by changes, never stale by a race,
bounded in count, bytes and age, and never past the entry's own expiry."""

from __future__ import annotations

from llm_router.cache.near import NearCache, NearCacheSettings, near_key
from llmapi.cache.v1 import cache_service_pb2 as cache_pb

WALL0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def wall(self) -> float:
        return WALL0 + self.now


def lookup(tenant: str, prompt: list[int]) -> cache_pb.LookupRequest:
    return cache_pb.LookupRequest(
        key=cache_pb.CacheKey(tenant_id=tenant, model="demo", prompt_token_ids=prompt)
    )


def hit(
    entry_id: str, text: str = "answer", expires_in_s: float | None = 60.0
) -> cache_pb.LookupResponse:
    response = cache_pb.LookupResponse(
        kind=cache_pb.HIT_KIND_EXACT,
        similarity=1.0,
        entry_id=entry_id,
        response=cache_pb.CachedResponse(text=text, token_ids=[1, 2, 3]),
    )
    if expires_in_s is not None:
        response.expires_at.FromMilliseconds(int((WALL0 + 100.0 + expires_in_s) * 1000))
    return response


def live_cache(clock: Clock, **settings: float) -> NearCache:
    near = NearCache(NearCacheSettings(**settings), clock=clock, wall=clock.wall)  # type: ignore[arg-type]
    near.heard(1000)
    return near


def test_a_kept_hit_is_served_per_tenant() -> None:
    clock = Clock()
    near = live_cache(clock)
    key = near_key(lookup("t1", [1, 2]))
    assert near.put(key, hit("a" * 32), near.begin())
    served = near.get(key)
    assert served is not None
    assert served.response.text == "answer"
    # Another tenant's identical request is another key.
    assert near.get(near_key(lookup("t2", [1, 2]))) is None
    assert near_key(lookup("t1", [1, 2])) == key  # deterministic


def test_nothing_is_kept_or_served_without_a_live_feed() -> None:
    clock = Clock()
    near = NearCache(NearCacheSettings(), clock=clock, wall=clock.wall)
    key = near_key(lookup("t", [1]))
    assert not near.put(key, hit("a" * 32), near.begin())
    near.heard(1000)
    assert near.put(key, hit("a" * 32), near.begin())
    # Three heartbeats unheard: the feed counts as lost and everything goes.
    clock.now += 3.5
    assert near.get(key) is None
    assert len(near) == 0
    near.heard(1000)
    assert near.get(key) is None


def test_lookups_begun_before_the_feed_went_live_are_not_kept() -> None:
    clock = Clock()
    near = NearCache(NearCacheSettings(), clock=clock, wall=clock.wall)
    key = near_key(lookup("t", [1]))
    since = near.begin()
    near.heard(1000)
    assert not near.put(key, hit("a" * 32), since)
    assert near.put(key, hit("a" * 32), near.begin())
    near.heard(1000)  # still live: lookups in flight stay valid
    assert near.put(key, hit("a" * 32), near.begin())


def test_a_lost_feed_clears_and_refuses_lookups_begun_before() -> None:
    clock = Clock()
    near = live_cache(clock)
    key = near_key(lookup("t", [1]))
    since = near.begin()
    near.lost()
    near.heard(1000)  # reconnected, but the change that broke it may have been missed
    assert not near.put(key, hit("a" * 32), since)
    assert near.put(key, hit("a" * 32), near.begin())


def test_a_change_drops_every_copy_of_the_entry() -> None:
    clock = Clock()
    near = live_cache(clock)
    k1, k2, k3 = (near_key(lookup("t", [i])) for i in (1, 2, 3))
    near.put(k1, hit("a" * 32), near.begin())
    near.put(k2, hit("a" * 32), near.begin())
    near.put(k3, hit("b" * 32), near.begin())
    assert near.changed(["a" * 32, "c" * 32]) == 2
    assert near.get(k1) is None
    assert near.get(k2) is None
    assert near.get(k3) is not None


def test_a_lookup_that_raced_a_change_is_not_kept() -> None:
    clock = Clock()
    near = live_cache(clock)
    key = near_key(lookup("t", [1]))
    since = near.begin()
    near.changed(["a" * 32])  # arrives while the lookup is in flight: its answer may be old
    assert not near.put(key, hit("a" * 32), since)
    assert near.put(key, hit("b" * 32), since)  # other ids are unaffected
    assert near.put(key, hit("a" * 32), near.begin())


def test_bounds_on_count_bytes_age_and_expiry() -> None:
    clock = Clock()
    near = live_cache(clock, max_entries=2, ttl_s=5.0)
    keys = [near_key(lookup("t", [i])) for i in range(3)]
    for i, key in enumerate(keys):
        near.put(key, hit(f"{i:032x}"), near.begin())
    assert near.get(keys[0]) is None  # least recently used went first
    assert len(near) == 2
    near.heard(1000)
    clock.now += 1.0
    near.heard(1000)
    short = near_key(lookup("t", [9]))
    assert near.put(short, hit("d" * 32, expires_in_s=2.0), near.begin())
    clock.now += 1.5  # past the entry's expiry (2 s from t=100), within the ttl
    near.heard(1000)
    assert near.get(short) is None
    clock.now += 3.0  # past the near ttl of the others
    near.heard(1000)
    assert near.get(keys[2]) is None
    # Already expired, or larger than the byte budget: refused.
    assert not near.put(short, hit("e" * 32, expires_in_s=-1.0), near.begin())
    small = live_cache(clock, max_bytes=200)
    big = hit("f" * 32, text="x" * 500)
    assert not small.put(short, big, small.begin())
    assert small.put(short, hit("f" * 32), small.begin())
    assert small.size_bytes <= 200


def test_only_hits_with_an_id_are_kept() -> None:
    clock = Clock()
    near = live_cache(clock)
    key = near_key(lookup("t", [1]))
    assert not near.put(key, hit(""), near.begin())
    assert near.put(key, hit("a" * 32, expires_in_s=None), near.begin())  # near ttl only
