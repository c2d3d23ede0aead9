"""The tokenization memo: bounded by ids held, aged out, keyed unambiguously."""

from __future__ import annotations

from llm_router.tokens.memo import MemoSettings, TokenMemo, memo_key


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_hit_returns_a_copy_of_the_ids() -> None:
    memo = TokenMemo(MemoSettings(max_tokens=100))
    key = memo_key([b"chat", b"t1", b"m", b"hello"])
    assert memo.get(key) is None
    memo.put(key, [1, 2, 3])
    got = memo.get(key)
    assert got == [1, 2, 3]
    assert got is not None
    got.append(99)  # the caller may mutate its list; the memo is unaffected
    assert memo.get(key) == [1, 2, 3]


def test_keys_are_length_prefixed() -> None:
    # ("ab", "c") and ("a", "bc") must not collide, nor tenants that share a prefix.
    assert memo_key([b"ab", b"c"]) != memo_key([b"a", b"bc"])
    assert memo_key([b"chat", b"t1", b"m", b"x"]) != memo_key([b"chat", b"t2", b"m", b"x"])


def test_bounded_by_ids_held_evicting_least_recently_used() -> None:
    memo = TokenMemo(MemoSettings(max_tokens=10))
    a, b, c = (memo_key([name]) for name in (b"a", b"b", b"c"))
    memo.put(a, [1] * 4)
    memo.put(b, [2] * 4)
    assert memo.get(a) is not None  # a is now the most recent
    memo.put(c, [3] * 4)  # 12 > 10: b goes
    assert memo.get(b) is None
    assert memo.get(a) == [1] * 4
    assert memo.get(c) == [3] * 4
    assert memo.held_tokens == 8


def test_an_entry_larger_than_the_memo_is_not_kept() -> None:
    memo = TokenMemo(MemoSettings(max_tokens=3))
    key = memo_key([b"big"])
    memo.put(key, [1, 2, 3, 4])
    assert memo.get(key) is None
    assert memo.held_tokens == 0


def test_entries_expire() -> None:
    clock = Clock()
    memo = TokenMemo(MemoSettings(max_tokens=100, ttl_s=5.0), clock=clock)
    key = memo_key([b"k"])
    memo.put(key, [7])
    clock.now = 4.9
    assert memo.get(key) == [7]
    clock.now = 5.0
    assert memo.get(key) is None
    assert memo.held_tokens == 0


def test_replacing_an_entry_keeps_the_count_right() -> None:
    memo = TokenMemo(MemoSettings(max_tokens=100))
    key = memo_key([b"k"])
    memo.put(key, [1, 2, 3])
    memo.put(key, [4])
    assert memo.get(key) == [4]
    assert memo.held_tokens == 1
