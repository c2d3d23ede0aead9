"""The SQLite outbox: durable across restarts and crashes, WAL mode, backoff, dead letters."""

from __future__ import annotations

import asyncio
import random
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llm_common.outbox import Delivery, Outbox, OutboxFull, OutboxItem
from llm_common.resilience import Backoff, backoff_delay


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "spool" / "outbox.db"


@pytest.fixture
async def outbox(path: Path) -> AsyncIterator[Outbox]:
    box = await Outbox.open(path)
    try:
        yield box
    finally:
        await box.close()


async def test_put_is_idempotent_by_key_and_delivery_removes(outbox: Outbox) -> None:
    assert await outbox.put("settle:r1", b"one")
    assert not await outbox.put("settle:r1", b"changed")  # first one kept
    assert await outbox.put("settle:r2", b"two")
    due = await outbox.due()
    assert [(i.key, i.payload, i.attempts) for i in due] == [
        ("settle:r1", b"one", 0),
        ("settle:r2", b"two", 0),
    ]
    await outbox.mark_delivered("settle:r1")
    assert await outbox.pending() == 1


async def test_many_deliveries_are_removed_at_once(outbox: Outbox) -> None:
    keys = [f"settle:m{i}" for i in range(1200)]  # more than one DELETE's worth of keys
    for key in keys:
        await outbox.put(key, b"x")
    await outbox.put("settle:kept", b"y")
    await outbox.mark_delivered()  # nothing: a no-op
    await outbox.mark_delivered(*keys)
    assert await outbox.pending() == 1
    assert [i.key for i in await outbox.due()] == ["settle:kept"]


async def test_database_is_in_wal_mode(outbox: Outbox, path: Path) -> None:
    with sqlite3.connect(path) as other:
        assert other.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_messages_and_schedule_survive_a_restart(path: Path) -> None:
    clock = FakeClock()
    first = await Outbox.open(path, clock=clock, rng=random.Random(1))
    await first.put("a", b"payload-a")
    await first.put("b", b"payload-b")
    (item, _) = await first.due()
    delay = await first.retry_later(item, "UNAVAILABLE")
    await first.close()

    again = await Outbox.open(path, clock=clock)
    try:
        assert await again.pending() == 2
        assert [i.key for i in await again.due()] == ["b"]  # "a" waits for its backoff
        clock.now += delay
        stored = {i.key: i for i in await again.due()}
        assert stored["a"].attempts == 1
        assert stored["a"].last_error == "UNAVAILABLE"
        assert stored["a"].payload == b"payload-a"
    finally:
        await again.close()


def test_messages_survive_a_process_crash(path: Path) -> None:
    # The writer dies without closing anything; the committed messages must still be there.
    script = textwrap.dedent(
        f"""
        import asyncio, os
        from pathlib import Path
        from llm_common.outbox import Outbox

        async def main():
            box = await Outbox.open(Path({str(path)!r}))
            for i in range(5):
                await box.put(f"settle:{{i}}", f"usage-{{i}}".encode())
            os._exit(3)

        asyncio.run(main())
        """
    )
    result = subprocess.run([sys.executable, "-c", script], timeout=60, check=False)
    assert result.returncode == 3

    async def read() -> list[OutboxItem]:
        box = await Outbox.open(path)
        try:
            return await box.due()
        finally:
            await box.close()

    items = asyncio.run(read())
    assert [(i.key, i.payload) for i in items] == [
        (f"settle:{i}", f"usage-{i}".encode()) for i in range(5)
    ]


async def test_retry_delays_follow_the_jittered_backoff(path: Path) -> None:
    clock, backoff = FakeClock(), Backoff(base=0.5, cap=4.0, jitter=0.25)
    box = await Outbox.open(path, clock=clock, backoff=backoff, rng=random.Random(7))
    try:
        await box.put("k", b"x")
        expected_rng = random.Random(7)
        for attempt in range(1, 7):
            (item,) = await box.due()
            delay = await box.retry_later(item, "down")
            assert delay == backoff_delay(attempt, base=0.5, cap=4.0, jitter=0.25, rng=expected_rng)
            assert min(0.5 * 2 ** (attempt - 1), 4.0) <= delay <= 4.0
            assert await box.due() == []  # not due before the delay has passed
            clock.now += delay
    finally:
        await box.close()


async def test_replay_stops_at_first_retry_and_keeps_rejected_as_dead_letters(
    path: Path,
) -> None:
    clock = FakeClock()
    box = await Outbox.open(path, clock=clock, backoff=Backoff(base=1.0, cap=1.0, jitter=0.0))
    try:
        for key in ("a", "b", "c", "d"):
            await box.put(key, key.encode())
            clock.now += 0.001  # distinct creation order
        answers = {"a": Delivery.DELIVERED, "b": Delivery.REJECTED, "c": Delivery.RETRY}
        seen: list[str] = []

        async def send(item: OutboxItem) -> Delivery:
            seen.append(item.key)
            return answers.get(item.key, Delivery.DELIVERED)

        stats = await box.replay_once(send)
        assert (stats.delivered, stats.rejected, stats.retried) == (1, 1, 1)
        assert seen == ["a", "b", "c"]  # "d" waits: the receiver looked down
        assert [i.key for i in await box.dead_letters()] == ["b"]
        assert await box.pending() == 2

        clock.now += 1.0
        answers["c"] = Delivery.DELIVERED
        stats = await box.replay_once(send)
        assert stats.delivered == 2
        assert await box.pending() == 0
        assert [i.key for i in await box.dead_letters()] == ["b"]  # kept, never replayed
        assert await box.drop_dead_letter("b")
    finally:
        await box.close()


async def test_a_send_that_raises_counts_as_a_retry(outbox: Outbox) -> None:
    await outbox.put("k", b"x")

    async def send(item: OutboxItem) -> Delivery:
        raise ConnectionError("refused")

    stats = await outbox.replay_once(send)
    assert stats.retried == 1
    assert await outbox.dead_letters() == []
    assert await outbox.pending() == 1


async def test_run_delivers_after_the_receiver_comes_back(path: Path) -> None:
    box = await Outbox.open(path, backoff=Backoff(base=0.01, cap=0.05, jitter=0.01))
    receiver_up, all_received = asyncio.Event(), asyncio.Event()
    received: list[str] = []

    async def send(item: OutboxItem) -> Delivery:
        if not receiver_up.is_set():
            return Delivery.RETRY
        received.append(item.key)
        if len(received) == 2:
            all_received.set()
        return Delivery.DELIVERED

    stop = asyncio.Event()
    try:
        await box.put("early", b"1")
        runner = asyncio.create_task(box.run(send, stop, idle_poll_s=0.05))
        await asyncio.sleep(0.1)
        assert received == []
        receiver_up.set()
        await box.put("late", b"2")  # wakes the loop up
        async with asyncio.timeout(10):
            await all_received.wait()
        assert sorted(received) == ["early", "late"]
        stop.set()
        async with asyncio.timeout(5):
            await runner
        assert await box.pending() == 0
    finally:
        stop.set()
        await box.close()


async def test_limits(path: Path) -> None:
    box = await Outbox.open(path, max_items=2, max_payload_bytes=8)
    try:
        await box.put("a", b"1")
        await box.put("b", b"2")
        with pytest.raises(OutboxFull):
            await box.put("c", b"3")
        assert not await box.put("a", b"1")  # a duplicate is not an overflow
        with pytest.raises(ValueError, match="larger"):
            await box.put("d", b"123456789")
        with pytest.raises(ValueError, match="key"):
            await box.put("", b"1")
    finally:
        await box.close()
    with pytest.raises(RuntimeError, match="closed"):
        await box.put("e", b"1")


async def test_concurrent_puts_are_all_stored(outbox: Outbox) -> None:
    results = await asyncio.gather(*(outbox.put(f"k{i}", b"x") for i in range(200)))
    assert all(results)
    assert await outbox.pending() == 200
