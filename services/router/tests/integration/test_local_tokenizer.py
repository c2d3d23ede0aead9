"""In-process tokenization: the same ids and errors as the tokenizer service, and where it is
used instead of the service (real tokenizer service on port 0, demo checkpoint)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import grpc
import pytest

from llm_common.errors import InvalidArgument
from llm_common.models_config import ModelCatalog
from llm_common.tokenization.registry import ModelLoadError
from llm_router.clients.tokenizer import TokenizerClient
from llm_router.tokens.local import LocalTokenizer, TokenizeMode, load_local
from llm_testing import free_port
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

from .conftest import MODEL, Stack, deployment, router_settings, running_router, with_deployments

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

SYSTEM, USER, ASSISTANT = common_pb2.ROLE_SYSTEM, common_pb2.ROLE_USER, common_pb2.ROLE_ASSISTANT
LONG = "A long prompt that goes to a worker thread, not the event loop. " * 40

CONVERSATIONS = [
    [(USER, "How far is the moon?")],
    [(SYSTEM, "You are terse."), (USER, "Name three rivers.")],
    [(USER, "Hi"), (ASSISTANT, "Hello! How can I help?"), (USER, "Tell me a joke.")],
    [(USER, "Ünïcödé, 中文, emoji 🚀 and tabs\tand\nnewlines")],
    [(USER, "Special-token text in content: <|bos|> <|user|> <|eos|>")],
    [(USER, "")],
    [(SYSTEM, LONG), (USER, LONG)],
]
TEXTS = ["How far is the moon?", "", "<|bos|> already here", "Ünïcödé 🚀", LONG]


def messages(turns: list[tuple[int, str]]) -> list[common_pb2.ChatMessage]:
    return [common_pb2.ChatMessage(role=role, content=text) for role, text in turns]


def local_of(stack: Stack) -> LocalTokenizer:
    local = load_local(stack.catalog, TokenizeMode.LOCAL)
    assert local is not None
    assert local.serves(MODEL)
    return local


@pytest.mark.parametrize("turns", CONVERSATIONS, ids=range(len(CONVERSATIONS)))
async def test_chat_prompts_match_the_service(stack: Stack, turns: list[tuple[int, str]]) -> None:
    service = TokenizerClient(stack.tokenizer.channel, 5.0)
    expected = await service.chat_prompt(MODEL, messages(turns))
    assert expected  # the template always writes BOS and the assistant marker
    assert await local_of(stack).chat_prompt(MODEL, messages(turns)) == expected


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
async def test_raw_prompts_match_the_service(stack: Stack, text: str) -> None:
    service = TokenizerClient(stack.tokenizer.channel, 5.0)
    expected = await service.encode(MODEL, text)
    assert await local_of(stack).encode(MODEL, text) == expected


async def test_template_errors_match_the_service(stack: Stack) -> None:
    # The demo template refuses a tool message that answers no call: the template's own
    # refusal, an INVALID_ARGUMENT on "messages" either way.
    turns = messages([(USER, "Hi"), (common_pb2.ROLE_TOOL, "{}")])
    service = TokenizerClient(stack.tokenizer.channel, 5.0)
    with pytest.raises(InvalidArgument) as remote:
        await service.chat_prompt(MODEL, turns)
    with pytest.raises(InvalidArgument) as local:
        await local_of(stack).chat_prompt(MODEL, turns)
    assert local.value.violations == remote.value.violations
    assert [v.field for v in local.value.violations] == ["messages"]
    assert "must answer a call" in local.value.violations[0].description


def with_missing_model(catalog: ModelCatalog, workdir: Path) -> ModelCatalog:
    """`catalog` plus a model whose checkpoint directory does not exist here."""
    missing = dataclasses.replace(
        catalog.models[MODEL], name="elsewhere", aliases=(), checkpoint=workdir / "absent"
    )
    return dataclasses.replace(catalog, models={**catalog.models, "elsewhere": missing})


async def test_auto_tokenizes_in_process_only_what_loads(stack: Stack, tmp_path: Path) -> None:
    catalog = with_missing_model(stack.catalog, tmp_path)
    local = load_local(catalog, TokenizeMode.AUTO)
    assert local is not None
    assert local.serves(MODEL)
    assert not local.serves("elsewhere")  # the service tokenizes it
    with pytest.raises(ModelLoadError, match="elsewhere"):
        load_local(catalog, TokenizeMode.LOCAL)
    assert load_local(catalog, TokenizeMode.SERVICE) is None


@pytest.mark.parametrize(
    ("mode", "answers"), [(TokenizeMode.AUTO, True), (TokenizeMode.SERVICE, False)]
)
async def test_the_mode_decides_whether_the_service_is_needed(
    stack: Stack, tmp_path: Path, mode: TokenizeMode, answers: bool
) -> None:
    catalog = with_deployments(stack.catalog, deployment("d", stack.replica_addrs))
    settings = router_settings(stack, tmp_path, cache=False)
    dead = f"127.0.0.1:{free_port()}"
    settings = dataclasses.replace(
        settings,
        downstream=dataclasses.replace(settings.downstream, tokenizer_addr=dead, call_timeout_s=1),
        tokenize=mode,
    )
    caller = await stack.tenant()
    request = pb.ChatRequest(
        model=MODEL,
        messages=messages([(USER, "Is the tokenizer service needed?")]),
        sampling=common_pb2.SamplingParams(max_tokens=2, ignore_eos=True, temperature=0.0),
    )
    async with running_router(settings, catalog) as router:
        if answers:
            reply = await router.stub.Chat(request, metadata=caller.metadata)
            assert reply.usage.completion_tokens == 2
            assert reply.usage.prompt_tokens > 0
        else:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await router.stub.Chat(request, metadata=caller.metadata)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
