"""bench_load's open-loop client: Poisson arrivals of ChatStream calls through the edge."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc
from load_config import MODEL, OUTPUT_MIX, PROMPT_MIX, WORDS

from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc


@dataclass
class Outcome:
    """One request: times in seconds on the monotonic clock, relative to nothing."""

    due: float
    sent: float = 0.0
    first: float | None = None
    done: float = 0.0
    tokens: int = 0
    code: str = "OK"
    details: str = ""
    inflight: int = 0  # requests still unanswered when this one was sent


def pick(rng: random.Random, mix: tuple[tuple[float, int], ...]) -> int:
    roll, total = rng.random(), 0.0
    for share, value in mix:
        total += share
        if roll < total:
            return value
    return mix[-1][1]


def request(rng: random.Random) -> pb.ChatStreamRequest:
    words = " ".join(rng.choice(WORDS) for _ in range(pick(rng, PROMPT_MIX)))
    sampling = common_pb2.SamplingParams(
        max_tokens=pick(rng, OUTPUT_MIX),
        temperature=0.8,
        seed=rng.randrange(1 << 31),
        ignore_eos=True,  # the output mix is exact: the demo model's EOS would cut it short
    )
    message = common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=f"Tell me about {words}")
    return pb.ChatStreamRequest(
        model=MODEL, messages=[message], sampling=sampling, cache=pb.CachePolicy(bypass=True)
    )


def arrivals(rng: random.Random, rate: float, duration_s: float) -> Iterator[float]:
    """Poisson arrival offsets (seconds from the start) over `duration_s`."""
    at = rng.expovariate(rate)
    while at < duration_s:
        yield at
        at += rng.expovariate(rate)


class Client:
    """Streams ChatStream calls through the edge and records what happened to each."""

    def __init__(self, edge: str, key: str, timeout_s: float) -> None:
        self._channel = grpc.aio.insecure_channel(edge)
        self._stub = pb_grpc.LLMServiceStub(self._channel)
        self._metadata = (("authorization", f"Bearer {key}"),)
        self._timeout_s = timeout_s

    async def one(self, message: pb.ChatStreamRequest, outcome: Outcome) -> None:
        outcome.sent = time.monotonic()
        call = self._stub.ChatStream(message, metadata=self._metadata, timeout=self._timeout_s)
        try:
            async for reply in call:
                # the first visible text (the output guard may hold early tokens back)
                if outcome.first is None and (reply.delta or reply.finish_reason):
                    outcome.first = time.monotonic()
                if reply.usage.completion_tokens:
                    outcome.tokens = reply.usage.completion_tokens
        except grpc.aio.AioRpcError as err:
            outcome.code = err.code().name
            outcome.details = (err.details() or "")[:200]
        outcome.done = time.monotonic()

    async def close(self) -> None:
        await self._channel.close()


async def open_loop(
    client: Client, rng: random.Random, rate: float, duration_s: float
) -> list[Outcome]:
    """Sends at Poisson times from now for `duration_s`, then waits for every answer."""
    start = time.monotonic()
    outcomes: list[Outcome] = []
    tasks: list[asyncio.Task[None]] = []
    pending: set[asyncio.Task[None]] = set()
    for offset in arrivals(rng, rate, duration_s):
        due = start + offset
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        outcome = Outcome(due=due, inflight=len(pending))
        outcomes.append(outcome)
        task = asyncio.create_task(client.one(request(rng), outcome))
        pending.add(task)
        task.add_done_callback(pending.discard)
        tasks.append(task)
    await asyncio.gather(*tasks)
    return outcomes
