"""Token grouping over a scripted event stream: counts, hold times, the gap rule, closing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from llm_inference.delivery import Delivery, Grouped
from llm_inference.engine.api import FinishReason, TokenEvent

pytestmark = pytest.mark.asyncio


def event(token: int, *, last: bool = False) -> TokenEvent:
    return TokenEvent(
        token_ids=(token,),
        text_delta=f"t{token} ",
        logprobs=None,
        finish_reason=FinishReason.LENGTH if last else None,
        prompt_tokens=3,
        completion_tokens=token,
        cached_tokens=0,
        timings=None,
    )


class Script:
    """Yields one event per token after the given pause (seconds), the last one final."""

    def __init__(self, pauses: Sequence[float]) -> None:
        self.pauses = pauses
        self.closed = False

    async def events(self) -> AsyncIterator[TokenEvent]:
        try:
            for i, pause in enumerate(self.pauses, start=1):
                await asyncio.sleep(pause)
                yield event(i, last=i == len(self.pauses))
        finally:
            self.closed = True


async def messages(script: Script, delivery: Delivery) -> list[tuple[int, ...]]:
    return [e.token_ids async for e in Grouped(script.events(), delivery)]


async def test_one_per_message_passes_events_through() -> None:
    script = Script([0.0] * 5)
    assert await messages(script, Delivery()) == [(1,), (2,), (3,), (4,), (5,)]


async def test_first_token_alone_then_full_messages_then_the_rest() -> None:
    script = Script([0.0] * 10)
    got = await messages(script, Delivery(max_tokens=4))
    assert got == [(1,), (2, 3, 4, 5), (6, 7, 8, 9), (10,)]


async def test_merged_events_keep_text_and_the_later_counts() -> None:
    script = Script([0.0] * 3)
    out = [e async for e in Grouped(script.events(), Delivery(max_tokens=8))]
    assert out[-1].text_delta == "t2 t3 "
    assert out[-1].completion_tokens == 3
    assert out[-1].finish_reason is FinishReason.LENGTH


async def test_a_held_token_goes_out_when_its_hold_time_ends() -> None:
    # Fast tokens, then a stall far longer than the hold time.
    script = Script([0.0, 0.001, 0.001, 0.5, 0.0])
    loop = asyncio.get_running_loop()
    started = loop.time()
    arrivals: list[tuple[tuple[int, ...], float]] = []
    async for e in Grouped(script.events(), Delivery(max_tokens=16, max_hold_s=0.05)):
        arrivals.append((e.token_ids, loop.time() - started))
    # After the stall tokens look slow, so 4 is not held either.
    assert [ids for ids, _ in arrivals] == [(1,), (2, 3), (4,), (5,)]
    assert arrivals[1][1] < 0.4  # sent at the hold limit, not after the stall


async def test_the_hold_time_counts_from_the_oldest_held_token() -> None:
    # A steady stream faster than the hold time: messages go out every hold time or so, not
    # once the (large) message is full.
    script = Script([0.0] + [0.01] * 20)
    got = await messages(script, Delivery(max_tokens=100, max_hold_s=0.035))
    assert len(got) >= 4
    assert sum(len(ids) for ids in got) == 21
    assert max(len(ids) for ids in got[1:-1]) <= 6


async def test_tokens_slower_than_the_hold_time_are_not_held() -> None:
    script = Script([0.0, 0.06, 0.06, 0.06])
    got = await messages(script, Delivery(max_tokens=16, max_hold_s=0.02))
    assert got == [(1,), (2,), (3,), (4,)]


async def test_closing_while_holding_closes_the_source() -> None:
    script = Script([0.0, 0.0, 0.0, 10.0, 0.0])
    grouper = Grouped(script.events(), Delivery(max_tokens=16, max_hold_s=5.0))
    stream = aiter(grouper)
    assert (await anext(stream)).token_ids == (1,)
    reader = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0.05)  # now waiting on the source, tokens 2 and 3 held
    assert grouper.generated == 3  # tokens 2 and 3 count though nobody got them yet
    reader.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reader
    assert script.closed


async def test_a_source_that_ends_without_a_last_event_flushes_what_is_held() -> None:
    async def broken() -> AsyncIterator[TokenEvent]:
        yield event(1)
        yield event(2)

    got = [e.token_ids async for e in Grouped(broken(), Delivery(max_tokens=4))]
    assert got == [(1,), (2,)]
