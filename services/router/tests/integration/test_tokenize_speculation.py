"""ROUTER_TOKENIZE=speculate: routing, the cache lookup and the replica's prefill start on the
router's own tokenization, and nothing is admitted or answered until the tokenizer service's
ids confirm it (real tokenizer service, replicas, auth and billing on port 0; demo model)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from llm_common.errors import InvalidArgument, parse_error
from llm_common.models_config import ModelCatalog
from llm_common.server import ServiceSpec
from llm_common.tokenization.registry import load_registry
from llm_router.clients.tokenizer import TokenizerClient
from llm_router.config import Settings
from llm_router.tokens.attestation import AttestationSettings
from llm_router.tokens.local import TokenizeMode, load_local
from llm_router.tokens.memo import MemoSettings, TokenMemo
from llm_router.tokens.prompt import PromptTokenizer
from llm_testing import RunningServer, free_port, running_server, settings_for_tests
from llm_tokenizer.config import Limits as TokenizerLimits
from llm_tokenizer.service import TokenizerServicer
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.tokenizer.v1 import tokenizer_service_pb2 as tok_pb
from llmapi.tokenizer.v1 import tokenizer_service_pb2_grpc as tok_grpc

from .conftest import (
    MODEL,
    Router,
    Stack,
    billed,
    deployment,
    router_settings,
    running_router,
    wait_for,
    with_deployments,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

USER, TOOL = common_pb2.ROLE_USER, common_pb2.ROLE_TOOL
SPECULATIONS = "llm_router_tokenize_speculations_total"
ABANDONED = "llm_router_abandoned_generations_total"
ROUTED = "llm_router_routing_decisions_total"
NEVER_ATTESTED = AttestationSettings(interval_s=0.0)


def chat(text: str, max_tokens: int = 3) -> pb.ChatRequest:
    return pb.ChatRequest(
        model=MODEL,
        messages=[common_pb2.ChatMessage(role=USER, content=text)],
        sampling=common_pb2.SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0),
    )


def speculating(
    stack: Stack,
    workdir: Path,
    tokenizer_addr: str | None = None,
    attestation: AttestationSettings = NEVER_ATTESTED,
) -> Settings:
    """Speculation on every request: by default the service is never asked to attest the
    router's files (test_tokenizer_attestation covers that)."""
    settings = router_settings(stack, workdir, cache=False)
    downstream = settings.downstream
    if tokenizer_addr is not None:
        downstream = dataclasses.replace(downstream, tokenizer_addr=tokenizer_addr)
    return dataclasses.replace(
        settings,
        downstream=downstream,
        tokenize=TokenizeMode.SPECULATE,
        attestation=attestation,
    )


class GatedTokenizer(TokenizerServicer):
    """The real tokenizer service, holding every ApplyChatTemplate until `gate` opens."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.gate = asyncio.Event()
        self.waiting = 0

    async def ApplyChatTemplate(  # noqa: N802
        self, request: tok_pb.ApplyChatTemplateRequest, context: Any
    ) -> tok_pb.ApplyChatTemplateResponse:
        self.waiting += 1
        await self.gate.wait()
        return await super().ApplyChatTemplate(request, context)


@contextlib.asynccontextmanager
async def gated_tokenizer(
    catalog: ModelCatalog, kind: type[GatedTokenizer] = GatedTokenizer
) -> AsyncIterator[tuple[RunningServer, GatedTokenizer]]:
    servicer = kind(load_registry(catalog), TokenizerLimits())

    def register(server: grpc.aio.Server) -> None:
        tok_grpc.add_TokenizerServiceServicer_to_server(servicer, server)

    names = (tok_pb.DESCRIPTOR.services_by_name["TokenizerService"].full_name,)
    spec = ServiceSpec(service_names=names, register=register)
    async with running_server(spec, settings=settings_for_tests("tok-gated")) as server:
        yield server, servicer


def total(router: Router, name: str) -> float:
    """A counter's sum over all its labels."""
    return sum(
        sample.value
        for family in router.registry.collect()
        for sample in family.samples
        if sample.name == name
    )


async def service_ids(stack: Stack, request: pb.ChatRequest) -> list[int]:
    return await TokenizerClient(stack.tokenizer.channel, 5.0).chat_prompt(MODEL, request.messages)


async def test_generation_starts_before_the_service_answers(stack: Stack, tmp_path: Path) -> None:
    catalog = with_deployments(stack.catalog, deployment("d", stack.replica_addrs))
    caller = await stack.tenant()
    request = chat("Start early")
    async with gated_tokenizer(stack.catalog) as (tokenizer, gated):
        settings = speculating(stack, tmp_path, tokenizer.target)
        async with running_router(settings, catalog) as router:
            call = asyncio.ensure_future(router.stub.Chat(request, metadata=caller.metadata))

            async def started_early() -> bool:
                return gated.waiting == 1 and total(router, ROUTED) == 1

            # A replica was chosen and asked to generate while the service still holds the ids.
            await wait_for(started_early)
            await asyncio.sleep(0.2)
            assert not call.done()  # nothing is answered before the service's ids confirm
            gated.gate.set()
            reply = await call
            assert router.metric(SPECULATIONS, outcome="confirmed") == 1
            assert router.metric(SPECULATIONS, outcome="mismatch") == 0
            # The wait for the service's ids is a phase of its own, apart from admission.
            waited = router.metric("llm_router_phase_seconds_sum", phase="tokenize_confirm")
            assert waited >= 0.2
            assert router.metric("llm_router_phase_seconds_count", phase="admission") == 1
    assert reply.usage.prompt_tokens == len(await service_ids(stack, request))
    assert reply.usage.completion_tokens == 3


def with_template(catalog: ModelCatalog, workdir: Path, template: str) -> ModelCatalog:
    """`catalog` with the demo model's files copied and its chat template replaced."""
    spec = catalog.models[MODEL]
    copy = workdir / "other-template"
    shutil.copytree(spec.checkpoint, copy, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    models = {**catalog.models, MODEL: dataclasses.replace(spec, checkpoint=copy)}
    return dataclasses.replace(catalog, models=models)


async def test_a_mismatch_restarts_on_the_services_ids(stack: Stack, tmp_path: Path) -> None:
    # The router's copy of the tokenizer files differs from the service's (a skewed rollout):
    # its template drops the newline after each role marker.
    template = (
        "{{ bos_token }}{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content']"
        " + eos_token }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}"
        "{% endif %}"
    )
    skewed = with_template(stack.catalog, tmp_path, template)
    local = load_local(skewed, TokenizeMode.SPECULATE)
    assert local is not None
    request = chat("Which tokens count?")
    expected = await service_ids(stack, request)
    assert await local.chat_prompt(MODEL, request.messages) != expected
    catalog = with_deployments(skewed, deployment("d", stack.replica_addrs))
    caller = await stack.tenant()
    async with running_router(speculating(stack, tmp_path), catalog) as router:
        reply = await router.stub.Chat(request, metadata=caller.metadata)
        assert router.metric(SPECULATIONS, outcome="mismatch") == 1
        assert router.metric(SPECULATIONS, outcome="confirmed") == 0
        assert router.metric(ABANDONED, reason="unconfirmed") == 1
        # One contradiction is enough: the model is no longer speculated on.
        again = await router.stub.Chat(chat("And now?"), metadata=caller.metadata)
        assert router.metric(SPECULATIONS, outcome="mismatch") == 1
        assert router.metric(ABANDONED, reason="unconfirmed") == 1
        assert again.usage.prompt_tokens == len(await service_ids(stack, chat("And now?")))
    # Admitted, generated and billed on the service's ids, once each.
    assert reply.usage.prompt_tokens == len(expected)
    assert reply.usage.completion_tokens == 3
    usage = await billed(stack, caller.tenant, 2)
    assert usage.prompt_tokens == reply.usage.prompt_tokens + again.usage.prompt_tokens


async def test_no_service_no_admission(stack: Stack, tmp_path: Path) -> None:
    catalog = with_deployments(stack.catalog, deployment("d", stack.replica_addrs))
    settings = speculating(stack, tmp_path, f"127.0.0.1:{free_port()}")
    settings = dataclasses.replace(
        settings, downstream=dataclasses.replace(settings.downstream, call_timeout_s=1)
    )
    caller = await stack.tenant()
    async with running_router(settings, catalog) as router:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await router.stub.Chat(chat("Is anyone there?"), metadata=caller.metadata)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        # Every generation started early (one per attempt: the test channel retries
        # UNAVAILABLE) was stopped.
        assert router.metric(ABANDONED, reason="refused") == total(router, ROUTED) >= 1
        assert router.metric(SPECULATIONS, outcome="confirmed") == 0


async def test_client_answers_at_once_then_confirms(stack: Stack) -> None:
    local = load_local(stack.catalog, TokenizeMode.SPECULATE)
    memo = TokenMemo(MemoSettings())
    client = PromptTokenizer(TokenizerClient(stack.tokenizer.channel, 5.0), memo, speculative=local)
    messages = chat("Memo me").messages
    first = await client.chat_prompt_ids(MODEL, messages, tenant="t1")
    assert first.confirm is not None
    assert await first.confirm == first.ids == await service_ids(stack, chat("Memo me"))
    again = await client.chat_prompt_ids(MODEL, messages, tenant="t1")
    assert again.confirm is None  # the memo holds the service's own ids
    assert again.ids == first.ids
    text = await client.encode_ids(MODEL, "raw text", tenant="t1")
    assert text.confirm is not None
    assert await text.confirm == text.ids


async def test_a_local_refusal_waits_for_the_services_verdict(stack: Stack) -> None:
    local = load_local(stack.catalog, TokenizeMode.SPECULATE)
    client = PromptTokenizer(TokenizerClient(stack.tokenizer.channel, 5.0), speculative=local)
    # Tool calls on a user turn: refused in-process and by the service alike.
    call = common_pb2.ToolCall(id="c1", function=common_pb2.FunctionCall(name="f", arguments="{}"))
    messages = [
        common_pb2.ChatMessage(role=USER, content="Hi", tool_calls=[call]),
        common_pb2.ChatMessage(role=TOOL, content="{}"),
    ]
    with pytest.raises(InvalidArgument) as err:
        await client.chat_prompt_ids(MODEL, messages)
    with pytest.raises(InvalidArgument) as service:
        await TokenizerClient(stack.tokenizer.channel, 5.0).chat_prompt(MODEL, messages)
    assert err.value.violations == service.value.violations
    assert err.value.violations[0].field.startswith("messages[0]")


async def test_an_overflow_is_the_services_verdict(stack: Stack, tmp_path: Path) -> None:
    catalog = with_deployments(stack.catalog, deployment("d", stack.replica_addrs))
    caller = await stack.tenant()
    request = chat("Too long an answer", max_tokens=5000)  # the demo context is 2,048
    async with running_router(speculating(stack, tmp_path), catalog) as router:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await router.stub.Chat(request, metadata=caller.metadata)
        details = parse_error(err.value)
        assert details.code == grpc.StatusCode.INVALID_ARGUMENT
        assert details.field_violations[0].field == "sampling.max_tokens"
        assert total(router, ROUTED) == 0  # nothing started on the router's own count
