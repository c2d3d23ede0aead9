"""ChangeFeed's fan-out: the first message, heartbeats, splitting, and how streams end."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from llm_cache.changes import READ_BLOCK_MS, Change
from llm_cache.config import FeedSettings
from llm_cache.feed import HEARTBEAT_INTERVAL_MS, MAX_IDS_PER_MESSAGE, ChangeFeed, Subscription
from llm_cache.metrics import CacheMetrics
from llm_common.errors import QuotaExceeded, Unavailable


def feed(**settings: int) -> ChangeFeed:
    return ChangeFeed(FeedSettings(**settings), CacheMetrics(CollectorRegistry()))


def queued(subscription: Subscription) -> list[tuple[str, ...]]:
    """The messages waiting, without waiting for more (the queue ends with an _End or not)."""
    messages = []
    while not subscription._queue.empty():
        item = subscription._queue.get_nowait()
        assert isinstance(item, tuple), "the stream has ended"
        messages.append(item)
    return messages


async def ended_with(subscription: Subscription) -> type[Exception] | None:
    """How the stream ends once its queued messages are read: an error type, or None."""
    try:
        async for _ in subscription:
            pass
    except (Unavailable, QuotaExceeded) as exc:
        return type(exc)
    return None


def test_the_log_is_read_more_often_than_the_heartbeat_interval() -> None:
    assert READ_BLOCK_MS < HEARTBEAT_INTERVAL_MS


def test_a_subscriber_hears_live_first_then_changes_or_heartbeats() -> None:
    f = feed()
    f.deliver([])
    with f.subscribe() as s:
        assert queued(s) == [()]  # live at once
        f.deliver(["a", "b", "a"])
        f.deliver([])
        assert queued(s) == [("a", "b"), ()]


def test_a_subscriber_waits_for_the_feed_to_be_live() -> None:
    f = feed()
    with f.subscribe() as waiting:
        assert queued(waiting) == []
        f.deliver(["a"])
        assert queued(waiting) == [(), ("a",)]


def test_going_live_on_a_quiet_read_sends_live_alone() -> None:
    f = feed()
    with f.subscribe() as waiting:
        f.deliver([])
        assert queued(waiting) == [()]  # no heartbeat right behind it


def test_many_ids_are_split_into_bounded_messages() -> None:
    f = feed()
    f.deliver([])
    ids = [f"{i:032x}" for i in range(2 * MAX_IDS_PER_MESSAGE + 5)]
    with f.subscribe() as s:
        queued(s)
        f.deliver(ids)
        messages = queued(s)
    assert [len(m) for m in messages] == [MAX_IDS_PER_MESSAGE, MAX_IDS_PER_MESSAGE, 5]
    assert [i for m in messages for i in m] == ids


async def test_changes_of_one_read_are_one_message() -> None:
    f = feed()
    f.deliver([])
    with f.subscribe() as s:
        queued(s)
        await f.changed([Change("o", "a", "t", ("x", "y")), Change("p", "d", "u", ("y", "z"))])
        assert queued(s) == [("x", "y", "z")]


async def test_a_failure_ends_every_stream_and_new_ones_wait_for_the_next_read() -> None:
    f = feed()
    f.deliver([])
    with f.subscribe() as a, f.subscribe() as b:
        f.deliver(["x"])  # dropped: the reader must drop everything anyway
        f.interrupted()
        assert not f.live
        assert len(f) == 0
        assert await ended_with(a) is Unavailable
        assert await ended_with(b) is Unavailable
    with f.subscribe() as c:
        assert queued(c) == []
        f.deliver([])
        assert queued(c) == [()]


async def test_a_reader_that_falls_behind_is_ended_alone() -> None:
    f = feed(max_pending=16)
    f.deliver([])
    with f.subscribe() as slow, f.subscribe() as fast:
        for i in range(20):
            f.deliver([str(i)])
            queued(fast)
        assert len(f) == 1
        assert await ended_with(slow) is Unavailable
        f.deliver(["next"])
        assert queued(fast) == [("next",)]


def test_subscribers_beyond_the_limit_are_refused_until_one_leaves() -> None:
    f = feed(max_subscribers=2)
    with f.subscribe(), f.subscribe():
        with pytest.raises(QuotaExceeded) as caught, f.subscribe():
            pass
        assert caught.value.retry_after_s is not None
    with f.subscribe():
        assert len(f) == 1


async def test_closing_ends_streams_cleanly_and_refuses_new_ones() -> None:
    f = feed()
    f.deliver([])
    with f.subscribe() as s:
        f.close()
        assert await ended_with(s) is None
    with pytest.raises(Unavailable), f.subscribe():
        pass
