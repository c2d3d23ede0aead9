"""bench_billing's constants: goal, arm names, the router's default batch shapes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from llm_router.clients.batching import BatchShape
from llm_router.clients.settings import DownstreamSettings
from llmapi.common.v1 import common_pb2

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
PRICES = ROOT / "infra" / "config" / "prices.yaml"
MODEL = "demo-llama"
TENANTS = 16
GOAL_SETTLES_PER_S = 2000.0
GOAL_P99_MS = 5.0
GOAL_CORES = 2
ROUNDS = 4  # the arms alternate, so drift in machine load hits all of them alike
STOP = common_pb2.FINISH_REASON_STOP
# Each channel is its own HTTP/2 connection (no shared subchannel), so that SO_REUSEPORT
# can spread a client's connections over the server processes.
CHANNEL_OPTIONS = [("grpc.use_local_subchannel_pool", 1)]
GRPC_ARMS = ("grpc", "grpc_baseline_1x1")
BATCHED_ARM = "grpc_batched_1x1"
SETTLE_ONLY_ARM = "settle_only_batch_1x1"
# The router's SettleBatcher as it runs by default (ROUTER_SETTLE_BATCH_*).
_ROUTER = DownstreamSettings(tokenizer_addr="-", billing_addr="-")
BATCH_MAX = _ROUTER.settle_batch_max
BATCH_WAIT_S = _ROUTER.settle_batch_wait_ms / 1000
BATCH_IN_FLIGHT = _ROUTER.settle_batch_in_flight
# The router's ReserveBatch coalescing as it runs by default (ROUTER_RESERVE_BATCH_*).
RESERVE_BATCH = BatchShape(
    _ROUTER.reserve_batch_max,
    _ROUTER.reserve_batch_wait_ms / 1000,
    _ROUTER.reserve_batch_in_flight,
)


def _shape(max_items: int, wait_s: float, in_flight: int) -> str:
    return (
        f"{max_items} items / {wait_s * 1e3:g} ms, sent at once while fewer than "
        f"{in_flight} are in flight"
    )


BATCH_SHAPE = _shape(BATCH_MAX, BATCH_WAIT_S, BATCH_IN_FLIGHT)
RESERVE_SHAPE = _shape(RESERVE_BATCH.max_items, RESERVE_BATCH.wait_s, RESERVE_BATCH.max_in_flight)
SETTLE_ONLY_CALLS_IN_FLIGHT = 2  # one answered while the next is on its way
STREAM_ARM = "settle_stream_1x1"
# The same stream through a batcher that always waits for its size or time (the router
# before ROUTER_SETTLE_BATCH_IN_FLIGHT): the in-run baseline of the batching rule.
STREAM_TIMER_ARM = "settle_stream_timer_only_1x1"
STREAM_RATE_PER_S = 2500.0  # offered settles/s of the open-loop arm: the goal plus 25%
# The same stream at the goal's own rate, plus 5%: over a round a little less is answered
# than is offered, and the goal is on what is answered.
GOAL_STREAM_ARM = "settle_stream_at_goal_1x1"
GOAL_STREAM_RATE_PER_S = GOAL_SETTLES_PER_S * 1.05
# Whole requests in the same open loop at the goal's rate + 5%, as the router meets them:
# each one's Reserve, then its settle through the SettleBatcher, so the Reserve calls load
# billing too. The Reserve calls are coalesced into ReserveBatch calls as the router does;
# the unary arm (a Reserve call each, the router before ReserveBatch) is the baseline.
PAIR_STREAM_ARM = "pair_stream_at_goal_1x1"
PAIR_STREAM_UNARY_ARM = "pair_stream_unary_reserve_at_goal_1x1"
OPEN_LOOP_ARMS = (STREAM_ARM, STREAM_TIMER_ARM, GOAL_STREAM_ARM, PAIR_STREAM_ARM,
                  PAIR_STREAM_UNARY_ARM)  # fmt: skip

PRE_RESERVED = ("settle_only", "settle_stream")  # modes that settle requests reserved ahead

Pair = Callable[[str, str], Awaitable[tuple[float, float]]]
