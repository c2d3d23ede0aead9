"""TokenizerServicer called directly (no sockets): domain errors and where the work runs."""

from __future__ import annotations

import threading
from typing import Any, cast

import pytest

from llm_common.errors import InvalidArgument, NotFound
from llm_common.models_config import ModelCatalog
from llm_common.tokenization import offload
from llm_common.tokenization.offload import INLINE_MAX_CHARS
from llm_common.tokenization.registry import load_registry
from llm_tokenizer.config import Limits
from llm_tokenizer.service import TokenizerServicer
from llmapi.common.v1 import common_pb2
from llmapi.tokenizer.v1 import tokenizer_service_pb2 as pb

CONTEXT = cast(Any, None)  # the servicer never touches the context


@pytest.fixture
def servicer(tiny_catalog: ModelCatalog) -> TokenizerServicer:
    return TokenizerServicer(load_registry(tiny_catalog), Limits(max_batch=4))


async def test_small_work_runs_inline_and_large_work_in_a_thread() -> None:
    loop_thread = threading.get_ident()
    assert await offload.run_sized(INLINE_MAX_CHARS, threading.get_ident) == loop_thread
    assert await offload.run_sized(INLINE_MAX_CHARS + 1, threading.get_ident) != loop_thread


async def test_encode_and_decode(servicer: TokenizerServicer) -> None:
    texts = ["Hello world", "x" * (INLINE_MAX_CHARS + 1)]  # one inline-sized, one not
    for batch in (texts[:1], texts):
        encoded = await servicer.Encode(pb.EncodeRequest(model="tiny", texts=batch), CONTEXT)
        assert encoded.total_tokens == sum(len(e.ids) for e in encoded.encodings)
        decoded = await servicer.Decode(
            pb.DecodeRequest(model="tiny-alias", sequences=encoded.encodings), CONTEXT
        )
        assert list(decoded.texts) == batch


async def test_unknown_model(servicer: TokenizerServicer) -> None:
    with pytest.raises(NotFound) as info:
        await servicer.Info(pb.InfoRequest(model="nope"), CONTEXT)
    assert (info.value.resource_type, info.value.resource_name) == ("model", "nope")


async def test_violations_are_collected(servicer: TokenizerServicer) -> None:
    request = pb.EncodeRequest(texts=["a"] * 5)
    with pytest.raises(InvalidArgument) as info:
        await servicer.Encode(request, CONTEXT)
    assert [v.field for v in info.value.violations] == ["model", "texts"]


async def test_count_messages_equals_template_with_generation_prompt(
    servicer: TokenizerServicer,
) -> None:
    messages = [common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content="Hi")]
    counted = await servicer.CountTokens(
        pb.CountTokensRequest(model="tiny", messages=messages), CONTEXT
    )
    rendered = await servicer.ApplyChatTemplate(
        pb.ApplyChatTemplateRequest(model="tiny", messages=messages, add_generation_prompt=True),
        CONTEXT,
    )
    assert rendered.prompt.endswith("[assistant]")
    assert counted.total == len(rendered.token_ids)


TOOLS = [common_pb2.Tool(function=common_pb2.FunctionDefinition(name="now"))]
USER = [common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content="Hi")]


async def test_tools_reach_the_template(servicer: TokenizerServicer) -> None:
    def request(model: str, tools: list[common_pb2.Tool]) -> pb.ApplyChatTemplateRequest:
        return pb.ApplyChatTemplateRequest(
            model=model, messages=USER, tools=tools, add_generation_prompt=True
        )

    plain = await servicer.ApplyChatTemplate(request("plain", TOOLS), CONTEXT)
    assert '<tools>\n{"type": "function", "function": {"name": "now"' in plain.prompt
    # `tiny`'s own template never reads `tools`: its prompt is the same either way.
    tiny = await servicer.ApplyChatTemplate(request("tiny", TOOLS), CONTEXT)
    assert tiny.prompt == (await servicer.ApplyChatTemplate(request("tiny", []), CONTEXT)).prompt
    counted = await servicer.CountTokens(
        pb.CountTokensRequest(model="plain", messages=USER, tools=TOOLS), CONTEXT
    )
    assert counted.total == len(plain.token_ids)


async def test_bad_tool_data_is_invalid_argument(servicer: TokenizerServicer) -> None:
    bad_call = common_pb2.ToolCall(function=common_pb2.FunctionCall(name="now", arguments="1"))
    messages = [common_pb2.ChatMessage(role=common_pb2.ROLE_ASSISTANT, tool_calls=[bad_call])]
    tools = [*TOOLS, *TOOLS]
    with pytest.raises(InvalidArgument) as info:
        await servicer.CountTokens(
            pb.CountTokensRequest(model="plain", messages=messages, tools=tools), CONTEXT
        )
    assert [v.field for v in info.value.violations] == [
        "messages[0].tool_calls[0].function.arguments",
        "tools[1].function.name",
    ]
