from __future__ import annotations

import random

import pytest

from llm_common.bounded_map import BoundedTTLMap


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_get_put_pop_and_len() -> None:
    m: BoundedTTLMap[str, int] = BoundedTTLMap(3)
    assert m.get("a") is None
    assert m.put("a", 1)
    assert m.get("a") == 1
    assert "a" in m
    assert "b" not in m
    assert len(m) == 1
    assert m.pop("a") == 1
    assert m.pop("a") is None
    assert len(m) == 0


def test_count_bound_evicts_least_recently_used() -> None:
    m: BoundedTTLMap[str, int] = BoundedTTLMap(2)
    m.put("a", 1)
    m.put("b", 2)
    assert m.get("a") == 1  # a is now the most recent
    m.put("c", 3)
    assert [k for k, _ in m.items()] == ["a", "c"]


def test_peek_does_not_touch() -> None:
    m: BoundedTTLMap[str, int] = BoundedTTLMap(2)
    m.put("a", 1)
    m.put("b", 2)
    assert m.peek("a") == 1
    m.put("c", 3)
    assert "a" not in m
    assert [k for k, _ in m.items()] == ["b", "c"]


def test_put_replaces_and_refreshes_recency() -> None:
    m: BoundedTTLMap[str, int] = BoundedTTLMap(2)
    m.put("a", 1)
    m.put("b", 2)
    m.put("a", 10)
    m.put("c", 3)
    assert dict(m.items()) == {"a": 10, "c": 3}


def test_zero_entries_keeps_nothing() -> None:
    m: BoundedTTLMap[str, int] = BoundedTTLMap(0)
    m.put("a", 1)
    assert len(m) == 0


def test_weight_bound() -> None:
    m: BoundedTTLMap[str, list[int]] = BoundedTTLMap(max_weight=5, weigh=len)
    assert m.put("a", [1, 2])
    assert m.put("b", [1, 2, 3])
    assert m.weight == 5
    assert m.put("c", [1])  # a (the oldest) goes
    assert dict(m.items()) == {"b": [1, 2, 3], "c": [1]}
    assert m.weight == 4
    m.put("b", [9])  # a replacement frees the old weight
    assert m.weight == 2


def test_too_heavy_is_not_stored_and_keeps_the_old_value() -> None:
    m: BoundedTTLMap[str, list[int]] = BoundedTTLMap(max_weight=3, weigh=len)
    m.put("a", [1])
    assert not m.put("a", [1, 2, 3, 4])
    assert m.get("a") == [1]
    assert m.weight == 1


def test_ttl_expiry_and_per_entry_override() -> None:
    clock = Clock()
    m: BoundedTTLMap[str, int] = BoundedTTLMap(10, ttl_s=5.0, clock=clock)
    m.put("a", 1)
    m.put("b", 2, ttl_s=1.0)
    clock.now += 0.999
    assert m.get("b") == 2
    clock.now += 0.001  # exactly at expiry: gone
    assert m.get("b") is None
    assert len(m) == 1  # dropped on read
    assert "a" in m
    clock.now += 4.0
    assert "a" not in m
    assert m.get("a") is None
    assert len(m) == 0


def test_expired_entries_are_not_listed_but_pop_returns_them() -> None:
    clock = Clock()
    m: BoundedTTLMap[str, int] = BoundedTTLMap(ttl_s=1.0, clock=clock)
    m.put("a", 1)
    clock.now += 2
    m.put("b", 2)
    assert list(m.items()) == [("b", 2)]
    assert "a" not in m
    assert m.pop("a") == 1  # what was held, so a caller can unindex it
    assert len(m) == 1


def test_no_ttl_never_expires() -> None:
    clock = Clock()
    m: BoundedTTLMap[str, int] = BoundedTTLMap(clock=clock)
    m.put("a", 1)
    clock.now += 1e12
    assert m.get("a") == 1


def test_on_evict_sees_room_and_expiry_not_pop_clear_or_replace() -> None:
    clock = Clock()
    seen: list[tuple[str, int]] = []
    m: BoundedTTLMap[str, int] = BoundedTTLMap(
        2, ttl_s=10, clock=clock, on_evict=lambda k, v: seen.append((k, v))
    )
    m.put("a", 1)
    m.put("a", 2)
    m.put("b", 3)
    m.put("c", 4)
    assert seen == [("a", 2)]
    m.pop("b")
    clock.now += 10
    assert m.get("c") is None
    assert seen == [("a", 2), ("c", 4)]
    m.put("d", 5)
    m.clear()
    assert seen == [("a", 2), ("c", 4)]
    assert m.weight == 0


def test_items_is_a_snapshot() -> None:
    m: BoundedTTLMap[int, int] = BoundedTTLMap()
    for i in range(3):
        m.put(i, i)
    for key, _ in m.items():
        m.pop(key)
    assert len(m) == 0


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_entries": -1},
        {"max_weight": -1, "weigh": len},
        {"max_weight": 3},
        {"weigh": len},
        {"ttl_s": -1.0},
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=r"must be|go together"):
        BoundedTTLMap(**kwargs)  # type: ignore[arg-type]


def test_matches_a_reference_model() -> None:
    """Random operations against a plain list-based LRU with expiry."""
    rng = random.Random(7)
    clock = Clock()
    m: BoundedTTLMap[int, str] = BoundedTTLMap(5, max_weight=12, weigh=len, ttl_s=3.0, clock=clock)
    model: list[tuple[int, str, float]] = []  # least recent first: key, value, expires

    def model_drop(key: int) -> None:
        model[:] = [e for e in model if e[0] != key]

    for _ in range(3000):
        op = rng.random()
        key = rng.randrange(10)
        if op < 0.45:
            value = "x" * rng.randrange(6)
            stored = m.put(key, value)
            assert stored == (len(value) <= 12)
            if stored:
                model_drop(key)
                model.append((key, value, clock.now + 3.0))
                while len(model) > 5 or sum(len(v) for _, v, _ in model) > 12:
                    model.pop(0)
        elif op < 0.85:
            found = [e for e in model if e[0] == key]
            expected = None
            if found:
                if clock.now >= found[0][2]:
                    model_drop(key)
                else:
                    expected = found[0][1]
                    model_drop(key)
                    model.append(found[0])
            assert m.get(key) == expected
        elif op < 0.9:
            found = [e for e in model if e[0] == key]
            model_drop(key)
            assert m.pop(key) == (found[0][1] if found else None)
        else:
            clock.now += rng.random()
        assert len(m) == len(model)
        assert m.weight == sum(len(v) for _, v, _ in model)
