"""Attested tokenization: while the tokenizer service's fingerprint equals the router's own,
prompts are counted in-process with no call; otherwise, or once the service stops answering,
every request is confirmed by the service again (real tokenizer service, replicas, auth and
billing on port 0; demo model)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import pytest

from llm_router.tokens.attestation import AttestationSettings
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.tokenizer.v1 import tokenizer_service_pb2 as tok_pb

from .conftest import MODEL, Router, Stack, billed, deployment, running_router, wait_for
from .conftest import with_deployments as deployed
from .test_tokenize_speculation import (
    GatedTokenizer,
    chat,
    gated_tokenizer,
    service_ids,
    speculating,
    with_template,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

QUICK = AttestationSettings(interval_s=0.2, audit_rate=0.0)  # answers older than 0.5 s void
ATTESTED = "llm_router_tokenizer_attested"
AUDITS = "llm_router_tokenizer_audits_total"
MEMO = "llm_router_token_memo_lookups_total"


def attested(router: Router) -> float:
    return router.metric(ATTESTED, model=MODEL)


async def until_attested(router: Router, value: float = 1.0) -> None:
    async def reached() -> bool:
        return attested(router) == value

    await wait_for(reached)


class LyingTokenizer(GatedTokenizer):
    """Claims the router's fingerprint but answers other ids (an input the digest missed)."""

    async def ApplyChatTemplate(  # noqa: N802
        self, request: tok_pb.ApplyChatTemplateRequest, context: Any
    ) -> tok_pb.ApplyChatTemplateResponse:
        reply = await super().ApplyChatTemplate(request, context)
        reply.token_ids.append(reply.token_ids[-1])
        return reply


async def test_attested_prompts_make_no_tokenizer_call(stack: Stack, tmp_path: Path) -> None:
    catalog = deployed(stack.catalog, deployment("d", stack.replica_addrs))
    caller = await stack.tenant()
    requests = [chat(f"Counted here {i}") for i in range(3)]
    expected = [len(await service_ids(stack, r)) for r in requests]
    async with gated_tokenizer(stack.catalog) as (tokenizer, counting):
        counting.gate.set()
        settings = speculating(stack, tmp_path, tokenizer.target, QUICK)
        async with running_router(settings, catalog) as router:
            await until_attested(router)
            replies = [await router.stub.Chat(r, metadata=caller.metadata) for r in requests]
    assert counting.waiting == 0  # no ApplyChatTemplate at all
    assert [r.usage.prompt_tokens for r in replies] == expected
    usage = await billed(stack, caller.tenant, 3)
    assert usage.prompt_tokens == sum(expected)


async def test_an_attested_repeat_is_not_tokenized_again(stack: Stack, tmp_path: Path) -> None:
    catalog = deployed(stack.catalog, deployment("d", stack.replica_addrs))
    caller = await stack.tenant()
    request = chat("Asked twice")
    async with gated_tokenizer(stack.catalog) as (tokenizer, counting):
        counting.gate.set()
        settings = speculating(stack, tmp_path, tokenizer.target, QUICK)
        async with running_router(settings, catalog) as router:
            await until_attested(router)
            replies = [await router.stub.Chat(request, metadata=caller.metadata) for _ in "ab"]
            memo = {r: router.metric(MEMO, result=r) for r in ("hit", "miss")}
    assert counting.waiting == 0
    assert memo == {"hit": 1, "miss": 1}  # the second took the first's ids from the memo
    expected = len(await service_ids(stack, request))
    assert [r.usage.prompt_tokens for r in replies] == [expected, expected]


async def test_other_files_are_confirmed_every_time(stack: Stack, tmp_path: Path) -> None:
    # The service's files differ from the router's (a separate template file with the same
    # text): the fingerprints differ, so nothing is taken on trust, though the ids agree.
    spec = stack.catalog.models[MODEL]
    template = json.loads((spec.checkpoint / "tokenizer_config.json").read_text())["chat_template"]
    other = with_template(stack.catalog, tmp_path, template)  # a copy of the same files
    (other.models[MODEL].checkpoint / "chat_template.jinja").write_text(template)
    catalog = deployed(stack.catalog, deployment("d", stack.replica_addrs))
    caller = await stack.tenant()
    async with gated_tokenizer(other) as (tokenizer, counting):
        counting.gate.set()
        settings = speculating(stack, tmp_path, tokenizer.target, QUICK)
        async with running_router(settings, catalog) as router:
            await asyncio.sleep(QUICK.interval_s * 3)  # a few polls answered
            assert attested(router) == 0
            reply = await router.stub.Chat(chat("Asked every time"), metadata=caller.metadata)
            assert counting.waiting == 1
    assert reply.usage.prompt_tokens == len(await service_ids(stack, chat("Asked every time")))


async def test_tokenizer_down_is_unavailable_again(stack: Stack, tmp_path: Path) -> None:
    catalog = deployed(stack.catalog, deployment("d", stack.replica_addrs))
    caller = await stack.tenant()
    async with gated_tokenizer(stack.catalog) as (tokenizer, counting):
        counting.gate.set()
        settings = speculating(stack, tmp_path, tokenizer.target, QUICK)
        async with running_router(settings, catalog) as router:
            await until_attested(router)
            await tokenizer.server.stop(0)
            # No exact count without the service once its last answer is too old: the
            # documented "tokenizer down → UNAVAILABLE", within max_age_s.
            await until_attested(router, 0.0)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await router.stub.Chat(chat("Anyone?"), metadata=caller.metadata)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_a_differing_audit_revokes_the_attestation(stack: Stack, tmp_path: Path) -> None:
    catalog = deployed(stack.catalog, deployment("d", stack.replica_addrs))
    caller = await stack.tenant()
    audit_all = AttestationSettings(interval_s=0.2, audit_rate=1.0)
    request = chat("Audited")
    async with gated_tokenizer(stack.catalog, LyingTokenizer) as (tokenizer, lying):
        lying.gate.set()
        settings = speculating(stack, tmp_path, tokenizer.target, audit_all)
        async with running_router(settings, catalog) as router:
            await until_attested(router)
            first = await router.stub.Chat(request, metadata=caller.metadata)

            async def audited() -> bool:
                return router.metric(AUDITS, outcome="different") == 1

            await wait_for(audited)
            assert attested(router) == 0
            again: pb.ChatResponse = await router.stub.Chat(request, metadata=caller.metadata)
            assert lying.waiting == 2  # the audit, then the confirmation it is back to
    ours = len(await service_ids(stack, request))
    assert first.usage.prompt_tokens == ours
    assert again.usage.prompt_tokens == ours + 1  # the service's ids decide again
