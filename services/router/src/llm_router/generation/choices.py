"""n > 1: a request for n completions runs as n generations of the same prompt.

Each choice is a generation of its own — admitted, billed, cached and logged as one — so
every completion is metered exactly. Prefix affinity sends the n prompts to the same replica,
whose prefix cache computes the prompt's full KV blocks once and shares them (the replica
reports them as cached tokens, billed at the cached-input price). A seeded request gives
choice i the seed `seed + i`, so each choice is reproducible and equals a single request
with that seed.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from llm_router.requests import GenerationRequest
from llmapi.common.v1 import common_pb2

T = TypeVar("T")


def choice_requests(request: GenerationRequest) -> list[GenerationRequest]:
    """One request per choice (the request itself when n is 1)."""
    n = request.choices
    if n == 1:
        return [request]
    return [_choice(request, index) for index in range(n)]


def _choice(request: GenerationRequest, index: int) -> GenerationRequest:
    sampling = common_pb2.SamplingParams()
    sampling.CopyFrom(request.sampling)
    sampling.n = 0
    if sampling.HasField("seed"):
        # Wraps within int64: a seed near the top still gives n distinct seeds.
        sampling.seed = (sampling.seed + index + 2**63) % 2**64 - 2**63
    # The fingerprint keys billing idempotency: each choice is its own billed generation.
    fingerprint = request.fingerprint + b"\0choice:" + str(index).encode()
    return dataclasses.replace(request, sampling=sampling, fingerprint=fingerprint)


def merged_usage(usages: Sequence[common_pb2.Usage]) -> common_pb2.Usage:
    """Usage of n choices: the prompt once (as the caller sent it once), every completion."""
    first = usages[0]
    completion = sum(u.completion_tokens for u in usages)
    return common_pb2.Usage(
        prompt_tokens=first.prompt_tokens,
        completion_tokens=completion,
        cached_tokens=first.cached_tokens,
        total_tokens=first.prompt_tokens + completion,
    )


@dataclass(frozen=True, slots=True)
class Indexed(Generic[T]):
    """An item of choice `index`."""

    index: int
    item: T


@dataclass(frozen=True, slots=True)
class _Ended:
    error: BaseException | None = None


async def interleaved(streams: Sequence[AsyncGenerator[T, None]]) -> AsyncGenerator[Indexed[T]]:
    """Items of every stream as they come, tagged with the stream's index; the first error
    ends it all (every stream is closed on the way out)."""
    queue: asyncio.Queue[Indexed[T] | _Ended] = asyncio.Queue()

    async def pump(index: int, stream: AsyncGenerator[T, None]) -> None:
        try:
            async for item in stream:
                await queue.put(Indexed(index, item))
        except Exception as error:
            await queue.put(_Ended(error))
            return
        await queue.put(_Ended())

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        running = len(tasks)
        while running:
            message = await queue.get()
            if isinstance(message, _Ended):
                if message.error is not None:
                    raise message.error
                running -= 1
                continue
            yield message
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await stream.aclose()
