"""CallBatcher's flush rules (at once while a call slot is free; else size, a returning
call or time, whichever first; whole-call failures to every caller) and the
ROUTER_SETTLE_BATCH_* and ROUTER_RESERVE_BATCH_* settings. The billing side is in
tests/integration/test_settle_batching.py."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from llm_common.config import ConfigError
from llm_common.deadlines import deadline_var, time_left
from llm_common.errors import InvalidArgument, Unavailable
from llm_common.logging import request_id_var
from llm_router.clients.billing import BillingCall, ItemResult, SettleBatcher
from llm_router.config import Settings
from llmapi.billing.v1 import billing_service_pb2 as billing_pb

REQUIRED = {"TOKENIZER_SERVICE_ADDR": "tok:1", "BILLING_SERVICE_ADDR": "bill:1",
            "AUTH_SERVICE_ADDR": "off", "CACHE_SERVICE_ADDR": "off"}  # fmt: skip


class RecordingSender:
    """Answers each settle with its request id; refuses ids starting with `bad`."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.time_left: list[float | None] = []  # the deadline each call ran under
        self.request_ids: list[str | None] = []  # the request id each call ran under (gated)
        self.down = False

    async def settle_batch(
        self, calls: Sequence[BillingCall], timeout_s: float
    ) -> list[ItemResult]:
        self.calls.append([c.request_id for c in calls])
        self.time_left.append(time_left())
        if self.down:
            raise Unavailable("billing is unavailable")
        return [
            InvalidArgument([]) if c.request_id.startswith("bad")
            else billing_pb.SettleResponse(request_id=c.request_id)
            for c in calls
        ]  # fmt: skip


def settle(rid: str) -> billing_pb.SettleRequest:
    return billing_pb.SettleRequest(request_id=rid)


async def test_a_full_queue_goes_out_at_once() -> None:
    sender = RecordingSender()
    batcher = SettleBatcher(sender.settle_batch, max_items=4, wait_s=60.0, timeout_s=1.0)
    replies = await asyncio.wait_for(
        asyncio.gather(*(batcher.submit(settle(f"r{i}")) for i in range(8))), timeout=5
    )
    assert sender.calls == [["r0", "r1", "r2", "r3"], ["r4", "r5", "r6", "r7"]]
    assert [r.request_id for r in replies] == [f"r{i}" for i in range(8)]  # type: ignore[union-attr]


async def test_a_partial_queue_goes_out_after_the_wait() -> None:
    sender = RecordingSender()
    batcher = SettleBatcher(sender.settle_batch, max_items=64, wait_s=0.01, timeout_s=1.0)
    first = asyncio.ensure_future(batcher.submit(settle("r0")))
    await asyncio.sleep(0)
    assert sender.calls == []
    assert len(batcher) == 1
    second = asyncio.ensure_future(batcher.submit(settle("r1")))
    await asyncio.wait_for(asyncio.gather(first, second), timeout=5)
    assert sender.calls == [["r0", "r1"]]
    assert len(batcher) == 0


async def test_each_caller_gets_its_own_outcome() -> None:
    sender = RecordingSender()
    batcher = SettleBatcher(sender.settle_batch, max_items=3, wait_s=60.0, timeout_s=1.0)
    results = await asyncio.gather(
        *(batcher.submit(settle(rid)) for rid in ("r0", "bad", "r2")), return_exceptions=True
    )
    assert isinstance(results[1], InvalidArgument)
    assert [r.request_id for r in (results[0], results[2])] == ["r0", "r2"]  # type: ignore[union-attr]


async def test_a_failed_call_fails_every_item_of_it() -> None:
    sender = RecordingSender()
    sender.down = True
    batcher = SettleBatcher(sender.settle_batch, max_items=2, wait_s=60.0, timeout_s=1.0)
    results = await asyncio.gather(
        batcher.submit(settle("r0")), batcher.submit(settle("r1")), return_exceptions=True
    )
    assert all(isinstance(r, Unavailable) for r in results)


async def test_flush_sends_the_queue_now() -> None:
    sender = RecordingSender()
    batcher = SettleBatcher(sender.settle_batch, max_items=64, wait_s=60.0, timeout_s=1.0)
    pending = asyncio.ensure_future(batcher.submit(settle("r0")))
    await asyncio.sleep(0)
    await asyncio.wait_for(batcher.flush(), timeout=5)
    assert (await pending).request_id == "r0"  # type: ignore[union-attr]
    assert sender.calls == [["r0"]]


class GatedSender(RecordingSender):
    """Holds every call until `open` is set, so calls stay in flight on demand."""

    def __init__(self) -> None:
        super().__init__()
        self.open = asyncio.Event()

    async def settle_batch(
        self, calls: Sequence[BillingCall], timeout_s: float
    ) -> list[ItemResult]:
        self.calls.append([c.request_id for c in calls])
        self.time_left.append(time_left())
        self.request_ids.append(request_id_var.get())
        await self.open.wait()
        return [billing_pb.SettleResponse(request_id=c.request_id) for c in calls]


def one_slot(sender: RecordingSender, wait_s: float = 60.0) -> SettleBatcher:
    """A batcher that sends at once while no call of it is in flight."""
    return SettleBatcher(
        sender.settle_batch, max_items=64, wait_s=wait_s, timeout_s=1.0, max_in_flight=1
    )


async def test_an_idle_batcher_sends_at_once() -> None:
    sender = RecordingSender()
    batcher = one_slot(sender)
    reply = await asyncio.wait_for(batcher.submit(settle("r0")), timeout=5)
    assert reply.request_id == "r0"  # type: ignore[union-attr]
    assert sender.calls == [["r0"]]


async def test_a_lingering_batcher_waits_even_with_room_but_flushes_at_once() -> None:
    sender = RecordingSender()
    batcher = SettleBatcher(
        sender.settle_batch, max_items=8, wait_s=1.0, timeout_s=5.0, max_in_flight=1,
        linger_s=0.05,
    )  # fmt: skip
    started = time.monotonic()
    first = asyncio.ensure_future(batcher.submit(settle("r0")))
    await asyncio.sleep(0.01)
    second = asyncio.ensure_future(batcher.submit(settle("r1")))
    await asyncio.wait_for(asyncio.gather(first, second), timeout=5)
    assert time.monotonic() - started >= 0.05
    assert sender.calls == [["r0", "r1"]]  # the linger gathered both
    pending = asyncio.ensure_future(batcher.submit(settle("r2")))
    await asyncio.sleep(0)
    await batcher.flush()  # shutdown does not wait out the linger
    assert sender.calls[-1] == ["r2"]
    await asyncio.wait_for(pending, timeout=5)


async def test_items_queued_behind_a_call_go_out_when_it_returns() -> None:
    sender = GatedSender()
    batcher = one_slot(sender)
    first = asyncio.ensure_future(batcher.submit(settle("r0")))
    await asyncio.sleep(0.01)
    rest = [asyncio.ensure_future(batcher.submit(settle(f"r{i}"))) for i in (1, 2, 3)]
    await asyncio.sleep(0.01)
    assert sender.calls == [["r0"]]  # the slot is taken: the others wait
    assert len(batcher) == 3
    sender.open.set()
    await asyncio.wait_for(asyncio.gather(first, *rest), timeout=5)
    assert sender.calls == [["r0"], ["r1", "r2", "r3"]]


async def test_a_batch_runs_in_its_first_caller_s_context_without_its_deadline() -> None:
    sender = GatedSender()
    batcher = one_slot(sender)

    async def caller(rid: str, seconds_left: float) -> object:
        deadline_var.set(time.monotonic() + seconds_left)  # this task's own RPC deadline
        request_id_var.set(rid)
        return await batcher.submit(settle(rid))

    first = asyncio.ensure_future(caller("r0", 0.005))
    await asyncio.sleep(0.01)
    # These two queue behind the first, whose deadline has passed by the time its call
    # returns and theirs goes out (from the first's completion).
    rest = [asyncio.ensure_future(caller(r, 30.0)) for r in ("r1", "r2")]
    await asyncio.sleep(0.01)
    sender.open.set()
    await asyncio.wait_for(asyncio.gather(first, *rest), timeout=5)
    assert sender.calls == [["r0"], ["r1", "r2"]]
    assert sender.time_left == [None, None]  # the batch call keeps its own timeout
    # Sent when r0's call returned, yet in the context of its own first caller.
    assert sender.request_ids == ["r0", "r1"]


async def test_a_shared_call_has_a_span_linked_to_each_caller() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    sender = GatedSender()
    batcher = SettleBatcher(
        sender.settle_batch, max_items=64, wait_s=60.0, timeout_s=1.0, max_in_flight=1,
        span_name="router.settle_batch", tracer=tracer,
    )  # fmt: skip

    async def caller(rid: str) -> trace.SpanContext:
        with tracer.start_as_current_span(f"request {rid}") as span:
            await batcher.submit(settle(rid))
            return span.get_span_context()

    first = asyncio.ensure_future(caller("r0"))
    await asyncio.sleep(0.01)
    rest = [asyncio.ensure_future(caller(r)) for r in ("r1", "r2")]
    await asyncio.sleep(0.01)
    sender.open.set()
    contexts = await asyncio.wait_for(asyncio.gather(first, *rest), timeout=5)

    (shared,) = [s for s in exporter.get_finished_spans() if s.name == "router.settle_batch"]
    assert sender.calls == [["r0"], ["r1", "r2"]]  # r0 went alone: no span of its own
    assert shared.parent is not None
    assert shared.parent.span_id == contexts[1].span_id  # in the trace of its first caller
    assert [link.context.span_id for link in shared.links] == [contexts[2].span_id]
    assert shared.attributes == {"batch.items": 2}
    # The other caller's own trace holds the call too, linked back to it.
    (item,) = [s for s in exporter.get_finished_spans() if s.name == "router.settle_batch.item"]
    assert item.parent is not None
    assert item.parent.span_id == contexts[2].span_id
    assert item.context.trace_id == contexts[2].trace_id
    assert [link.context.span_id for link in item.links] == [shared.context.span_id]
    assert item.start_time >= shared.start_time
    assert item.end_time <= shared.end_time


async def test_the_wait_still_caps_a_queue_behind_a_slow_call() -> None:
    sender = GatedSender()
    batcher = one_slot(sender, wait_s=0.01)
    first = asyncio.ensure_future(batcher.submit(settle("r0")))
    await asyncio.sleep(0)
    second = asyncio.ensure_future(batcher.submit(settle("r1")))
    await asyncio.sleep(0.1)
    assert sender.calls == [["r0"], ["r1"]]  # sent after the wait, the first still in flight
    sender.open.set()
    await asyncio.wait_for(asyncio.gather(first, second), timeout=5)


@pytest.mark.parametrize(
    ("kind", "defaults"), [("settle", (64, 2.0, 1)), ("reserve", (64, 1.0, 1))]
)
def test_batching_is_on_by_default_and_configurable(
    kind: str, defaults: tuple[int, float, int]
) -> None:
    def shape(settings: Settings) -> tuple[int, float, int]:
        d = settings.downstream
        return (
            getattr(d, f"{kind}_batch_max"),
            getattr(d, f"{kind}_batch_wait_ms"),
            getattr(d, f"{kind}_batch_in_flight"),
        )

    assert shape(Settings.from_env(REQUIRED)) == defaults
    prefix = f"ROUTER_{kind.upper()}_BATCH"
    custom = {f"{prefix}_MAX": "0", f"{prefix}_WAIT_MS": "5", f"{prefix}_IN_FLIGHT": "0"}
    assert shape(Settings.from_env({**REQUIRED, **custom})) == (0, 5.0, 0)


@pytest.mark.parametrize("kind", ["SETTLE", "RESERVE"])
@pytest.mark.parametrize(
    ("name", "value"),
    [("MAX", "257"), ("MAX", "-1"), ("WAIT_MS", "-1"), ("WAIT_MS", "5000"),
     ("IN_FLIGHT", "-1"), ("IN_FLIGHT", "65")],
)  # fmt: skip
def test_bad_batch_settings_name_the_variable(kind: str, name: str, value: str) -> None:
    variable = f"ROUTER_{kind}_BATCH_{name}"
    with pytest.raises(ConfigError) as exc:
        Settings.from_env({**REQUIRED, variable: value})
    assert str(exc.value).startswith(variable)
