"""Mid-stream migration against real replicas: a replica killed after output began, the stream
continues on another one with no error, token-identical to an unbroken run (greedy and seeded),
and every token is billed once."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from llm_router.routing.settings import RoutingSettings
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

from .conftest import (
    Caller,
    Router,
    Stack,
    billed,
    deployment,
    router_settings,
    running_inference,
    running_router,
    with_deployments,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
ROUTING = RoutingSettings(
    load_interval_ms=50, load_stale_s=2.0, retry_base_s=0.01, retry_jitter_s=0.01, exclude_s=30.0,
    exclude_max_s=60.0,
)  # fmt: skip
MAX_TOKENS = 48
GREEDY = common_pb2.SamplingParams(
    temperature=0.0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=True
)
SEEDED = common_pb2.SamplingParams(
    temperature=1.0, top_k=40, seed=31, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=True,
    frequency_penalty=0.5,
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class Answer:
    text: str
    token_ids: list[int]
    finish: int
    completion_tokens: int


def request(sampling: common_pb2.SamplingParams) -> pb.ChatStreamRequest:
    return pb.ChatStreamRequest(
        model="demo",
        messages=[common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content="Tell me a story")],
        sampling=sampling,
        cache=pb.CachePolicy(bypass=True),
    )


async def stream(
    router: Router,
    caller: Caller,
    sampling: common_pb2.SamplingParams,
    kill_after: int = 0,
    kill: Callable[[], Awaitable[None]] | None = None,
) -> Answer:
    """Stream one answer; after `kill_after` messages, await `kill()` (a replica dies)."""
    messages = []
    async for message in router.stub.ChatStream(request(sampling), metadata=caller.metadata):
        messages.append(message)
        if kill is not None and len(messages) == kill_after:
            await kill()
    last = messages[-1]
    return Answer(
        "".join(m.delta for m in messages),
        [lp.token_id for m in messages for lp in m.logprobs],
        last.finish_reason,
        last.usage.completion_tokens,
    )


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
async def test_a_stream_cut_mid_way_continues_identically_on_another_replica(
    stack: Stack, tmp_path: Path, sampling: common_pb2.SamplingParams
) -> None:
    survivor = stack.replica_addrs[0]
    caller = await stack.tenant()
    settings = router_settings(stack, tmp_path, routing=ROUTING)
    only_survivor = with_deployments(stack.catalog, deployment("survivor", [survivor]))
    async with running_router(settings, only_survivor) as router:
        unbroken = await stream(router, caller, sampling)
    assert unbroken.completion_tokens == MAX_TOKENS
    assert len(unbroken.token_ids) == MAX_TOKENS

    async with running_inference(stack.workdir / "models.yaml", "doomed") as doomed:
        # The doomed replica is tried first; the survivor only takes over.
        catalog = with_deployments(
            stack.catalog,
            deployment("primary", [doomed.target], weight=100),
            deployment("fallback", [survivor], weight=0),
        )
        settings = router_settings(stack, tmp_path, routing=ROUTING)
        async with running_router(settings, catalog) as router:

            async def kill() -> None:
                await doomed.server.stop(0)

            cut = await stream(router, caller, sampling, kill_after=4, kill=kill)
            migrated = router.metric("llm_router_migrations_total", model="demo-llama",
                                     outcome="resumed")  # fmt: skip
            assert router.runtime.board.health(doomed.target) == "excluded"
    assert migrated == 1
    assert cut == unbroken  # text, token ids, finish reason and usage
    usage = await billed(stack, caller.tenant, requests=2)
    assert usage.completion_tokens == 2 * MAX_TOKENS  # each token billed once


async def test_without_another_replica_the_stream_ends_with_error(
    stack: Stack, tmp_path: Path
) -> None:
    caller = await stack.tenant()
    async with running_inference(stack.workdir / "models.yaml", "alone") as alone:
        catalog = with_deployments(stack.catalog, deployment("alone", [alone.target]))
        async with running_router(router_settings(stack, tmp_path, routing=ROUTING), catalog) as r:

            async def kill() -> None:
                await alone.server.stop(0)

            answer = await stream(r, caller, GREEDY, kill_after=3, kill=kill)
            lost = r.metric("llm_router_migrations_total", model="demo-llama", outcome="lost")
    assert answer.finish == common_pb2.FINISH_REASON_ERROR
    assert 0 < answer.completion_tokens < MAX_TOKENS
    assert answer.completion_tokens == len(answer.token_ids)
    assert lost == 1
