"""Coalesce calls to billing into batch calls (SettleBatch, ReserveBatch).

grpc-python spends about as much CPU per unary call on each side as billing spends on the
ledger, and under load the calls in flight queue up in billing's one event loop, so one call
per item caps billing's throughput and stretches its tail. A batch goes out at once while
fewer than `max_in_flight` batches are in flight (so an idle router never waits: its one item
goes alone), and under load the calls in flight set the batch size; otherwise when
`max_items` are queued, when a batch in flight returns, or `wait_s` after its first item,
whichever comes first. Each caller gets its own item's outcome (a response, or the
ServiceError the unary call would have raised).

A call runs in the context of its first caller (request id and trace, not its deadline: the
call serves every caller, with its own timeout). A call shared by several callers has a span
of its own, a child of the first caller's, with a link to each other caller's span; each
other caller gets a `<span>.item` span in its own trace for the same time, linked back to the
call's span. Trace views that follow links only one way still show every request its call.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace

from llm_common.deadlines import without_deadline

MAX_BATCH_ITEMS = 256  # billing's limit per SettleBatch and ReserveBatch

Call = TypeVar("Call")
Response = TypeVar("Response")
# Sends one batch: per item its response or the error the unary call would have raised; a
# failure of the whole call is raised.
SendBatch = Callable[[Sequence[Call], float], Awaitable[Sequence[Response | Exception]]]


@dataclass(frozen=True, slots=True)
class BatchShape:
    """How a CallBatcher coalesces calls: at most `max_items` a call, at most `wait_s` of
    waiting for company, sent at once while fewer than `max_in_flight` calls are in flight."""

    max_items: int
    wait_s: float
    max_in_flight: int


@dataclass(frozen=True, slots=True)
class _Queued(Generic[Call, Response]):
    """A queued call, its caller's future and its caller's context."""

    call: Call
    future: asyncio.Future[Response]
    context: contextvars.Context


class CallBatcher(Generic[Call, Response]):
    """Queues calls and sends them in batches through `send`.

    `max_in_flight` 0: every batch waits for `max_items` or `wait_s`. `linger_s`: with room
    in flight, a call still waits this long for company before it goes (0: at once). A
    failure of the whole call (e.g. UNAVAILABLE) is raised to every caller of that batch,
    exactly as the unary call would have raised it to each."""

    def __init__(
        self,
        send: SendBatch[Call, Response],
        *,
        max_items: int,
        wait_s: float,
        timeout_s: float,
        max_in_flight: int = 0,
        linger_s: float = 0.0,
        span_name: str = "router.batch",
        tracer: trace.Tracer | None = None,
    ) -> None:
        if not 1 <= max_items <= MAX_BATCH_ITEMS:
            raise ValueError(f"max_items must be in 1..{MAX_BATCH_ITEMS}")
        if max_in_flight < 0:
            raise ValueError("max_in_flight must be >= 0")
        self._send_batch = send
        self._max_items = max_items
        self._wait_s = wait_s
        self._timeout_s = timeout_s
        self._max_in_flight = max_in_flight
        self._linger_s = linger_s
        self._span_name = span_name
        self._tracer = tracer or trace.get_tracer(__name__)
        self._queue: list[_Queued[Call, Response]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._in_flight: set[asyncio.Task[None]] = set()
        self.batches_sent = 0

    def __len__(self) -> int:
        """Calls queued, not yet sent."""
        return len(self._queue)

    async def submit(self, call: Call) -> Response:
        """Queue `call`; its response once its batch is answered, else its ServiceError."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Response] = loop.create_future()
        self._queue.append(_Queued(call, future, contextvars.copy_context()))
        room = self._room()
        if len(self._queue) >= self._max_items or (room and self._linger_s <= 0):
            self._send_queued()
        elif self._timer is None:
            delay = self._linger_s if room else self._wait_s
            self._timer = loop.call_later(delay, self._send_queued)
        return await future

    async def flush(self) -> None:
        """Send what is queued now and wait for every batch in flight (shutdown)."""
        self._send_queued()
        if self._in_flight:
            await asyncio.wait(set(self._in_flight))

    def _room(self) -> bool:
        return len(self._in_flight) < self._max_in_flight

    def _after(self, task: asyncio.Task[None]) -> None:
        # A batch returned: what queued behind it goes out now, without waiting for its timer.
        self._in_flight.discard(task)
        if self._queue and self._room():
            self._send_queued()

    def _send_queued(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._queue:
            return
        batch, self._queue = self._queue, []
        # In the first caller's context, whoever sends it (a returning call or a timer runs in
        # some other caller's), without its deadline: each caller stops waiting at its own.
        context = without_deadline(batch[0].context)
        task = asyncio.get_running_loop().create_task(self._send(batch), context=context)
        self._in_flight.add(task)
        task.add_done_callback(self._after)

    async def _send(self, batch: list[_Queued[Call, Response]]) -> None:
        self.batches_sent += 1
        try:
            results = await self._call(batch)
        except Exception as exc:  # the whole call failed: each caller sees it as its own
            for queued in batch:
                future = queued.future
                if not future.done():
                    future.set_exception(exc)
            return
        for queued, result in zip(batch, results, strict=True):
            future = queued.future
            if future.done():  # its caller was cancelled
                continue
            if isinstance(result, Exception):
                future.set_exception(result)
            else:
                future.set_result(result)

    async def _call(self, batch: list[_Queued[Call, Response]]) -> Sequence[Response | Exception]:
        calls = [queued.call for queued in batch]
        if len(batch) == 1:  # its caller's own trace holds the call
            return await self._send_batch(calls, self._timeout_s)
        riders = [queued.context.run(otel_context.get_current) for queued in batch[1:]]
        others = (trace.get_current_span(rider).get_span_context() for rider in riders)
        links = [trace.Link(span) for span in others if span.is_valid]
        attributes = {"batch.items": len(batch)}
        with self._tracer.start_as_current_span(
            self._span_name, links=links, attributes=attributes
        ) as shared:
            back = [trace.Link(shared.get_span_context())]
            items = [
                self._tracer.start_span(
                    f"{self._span_name}.item", rider, links=back, attributes=attributes
                )
                for rider in riders
            ]
            try:
                return await self._send_batch(calls, self._timeout_s)
            finally:
                for item in items:
                    item.end()
