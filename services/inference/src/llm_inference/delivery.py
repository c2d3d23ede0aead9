"""Token grouping for Generate streams: fewer, larger messages at a bounded delay.

Every message costs the caller, and each proxy on the way, a wake-up and a frame whatever it
holds; at a few milliseconds per step that per-message cost is most of a router's CPU. The
first token goes out at once (time to first token is unchanged) and so does the last
message; tokens in between wait for company up to a count and a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from llm_inference.engine.api import TokenEvent

MAX_TOKENS_PER_MESSAGE = 4096
MAX_HOLD_MS = 60_000
# Weight of the newest gap between engine events in the running estimate.
GAP_SMOOTHING = 0.3


@dataclass(frozen=True, slots=True)
class Delivery:
    """How a stream groups tokens: up to `max_tokens` per message, none held past `max_hold_s`
    (0: no time limit). `max_tokens` <= 1 sends every engine event as it comes."""

    max_tokens: int = 1
    max_hold_s: float = 0.0

    @property
    def groups(self) -> bool:
        return self.max_tokens > 1


class Grouped:
    """`events` delivered as `delivery` says; iterate once, then `aclose()`. `generated`
    counts the tokens the engine produced so far, held ones included."""

    def __init__(self, events: AsyncIterator[TokenEvent], delivery: Delivery) -> None:
        self.generated = 0
        self._events = events
        self._delivery = delivery
        self._loop = asyncio.get_running_loop()
        self._held: TokenEvent | None = None
        self._held_since = 0.0
        self._last_at: float | None = None
        self._gap_s = 0.0  # smoothed time between engine events
        self._next: asyncio.Future[TokenEvent] | None = None
        self._stream: AsyncGenerator[TokenEvent, None] = (
            self._grouped() if delivery.groups else self._each()
        )

    def __aiter__(self) -> AsyncIterator[TokenEvent]:
        return self._stream

    async def aclose(self) -> None:
        """Close the stream (and a read it has pending; not the engine's stream itself)."""
        await self._stream.aclose()

    async def _each(self) -> AsyncGenerator[TokenEvent, None]:
        async for event in self._events:
            self.generated = event.completion_tokens
            yield event

    async def _grouped(self) -> AsyncGenerator[TokenEvent, None]:
        sent_first = False
        try:
            while True:
                try:
                    event = await self._receive()
                except StopAsyncIteration:  # ended without a last event: the engine's fault
                    if self._held is not None:
                        yield self._take()
                    return
                if event is None:  # the hold time ran out: send what is held
                    yield self._take()
                    continue
                self.generated = event.completion_tokens
                self._observe_gap()
                held_since = self._loop.time()
                if self._held is not None:  # the hold time counts from the oldest token
                    held_since = self._held_since
                    event = self._take().then(event)
                if not sent_first or event.finish_reason is not None or not self._may_hold(event):
                    sent_first = sent_first or bool(event.token_ids)
                    yield event
                    if event.finish_reason is not None:
                        return
                    continue
                self._held, self._held_since = event, held_since
        finally:
            await self._cancel_next()

    async def _receive(self) -> TokenEvent | None:
        """The next engine event; None when the hold time of what is held ran out first.
        StopAsyncIteration when the engine's stream ended."""
        if self._next is None:
            if self._held is None or not self._delivery.max_hold_s:
                return await anext(self._events)
            # A task, not wait_for: a timeout must not cancel (and so abort) the engine's stream.
            self._next = asyncio.ensure_future(anext(self._events))
        if self._held is None:
            await asyncio.wait((self._next,))
        else:
            remaining = self._held_since + self._delivery.max_hold_s - self._loop.time()
            if remaining > 0:
                await asyncio.wait((self._next,), timeout=remaining)
            if not self._next.done():
                return None
        pending, self._next = self._next, None
        return pending.result()

    def _may_hold(self, event: TokenEvent) -> bool:
        """Hold `event` for more tokens: the message is not full, and (with a time limit) the
        engine makes tokens faster than the limit, so waiting will actually group some."""
        if len(event.token_ids) >= self._delivery.max_tokens:
            return False
        return not self._delivery.max_hold_s or self._gap_s < self._delivery.max_hold_s

    def _observe_gap(self) -> None:
        now = self._loop.time()
        if self._last_at is not None:
            gap = now - self._last_at
            self._gap_s = (
                gap if not self._gap_s else self._gap_s + GAP_SMOOTHING * (gap - self._gap_s)
            )
        self._last_at = now

    def _take(self) -> TokenEvent:
        held, self._held = self._held, None
        if held is None:
            raise RuntimeError("no event is held")
        return held

    async def _cancel_next(self) -> None:
        # Closing mid-wait: end the pending read (which closes the engine's stream as
        # cancellation does) and let it finish, so the stream can be closed after us.
        pending, self._next = self._next, None
        if pending is None:
            return
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await pending
