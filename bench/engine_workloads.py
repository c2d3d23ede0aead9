"""bench_engine's workloads: mixed requests, shared-prefix requests, greedy sampling."""

from __future__ import annotations

import random

from engine_config import FIRST_ID
from engine_values import Request

from llm_inference.engine.api import SamplingOptions


def mixed_requests(
    count: int,
    seed: int,
    vocab: int,
    prompt_range: tuple[int, int] = (16, 512),
    output_range: tuple[int, int] = (16, 256),
) -> list[Request]:
    rng = random.Random(seed)
    return [
        Request(
            [rng.randrange(FIRST_ID, vocab) for _ in range(rng.randint(*prompt_range))],
            rng.randint(*output_range),
        )
        for _ in range(count)
    ]


def shared_prefix_requests(count: int, seed: int, vocab: int) -> list[Request]:
    rng = random.Random(seed)
    system = [rng.randrange(FIRST_ID, vocab) for _ in range(384)]
    return [
        Request(system + [rng.randrange(FIRST_ID, vocab) for _ in range(rng.randint(8, 64))], 16)
        for _ in range(count)
    ]


def greedy(max_tokens: int) -> SamplingOptions:
    return SamplingOptions(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True, detokenize=False
    )
