"""TokenizerService over a real grpc.aio server on port 0, with the demo checkpoint."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tokenizers import Tokenizer

from llm_common.errors import FieldViolation, parse_error
from llm_common.models_config import load_catalog
from llm_common.tokenization.registry import Registry, load_registry
from llm_testing import RunningServer, running_server, settings_for_tests
from llm_tokenizer.config import Limits
from llm_tokenizer.server import SERVICE_NAME, build_spec
from llmapi.common.v1 import common_pb2
from llmapi.tokenizer.v1 import tokenizer_service_pb2 as pb
from llmapi.tokenizer.v1 import tokenizer_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

DEMO = "demo-llama"
LIMITS = Limits(max_batch=64, max_text_bytes=4096, max_ids_per_sequence=4096, max_messages=8)
UNICODE_TEXTS = [
    "Hello, world!",
    "",
    "Emoji 👍🏽 and a family 👩‍👩‍👧 🎉",
    "中文文本和日本語のテキスト、混在。한국어도",
    "  spaces\tand\nnewlines\r\n  ",
    "Ünïcödé façade — naïve café ∑ 𝔘𝔫𝔦 <|eos|> marker",
]
S, U, A, T = (
    common_pb2.ROLE_SYSTEM,
    common_pb2.ROLE_USER,
    common_pb2.ROLE_ASSISTANT,
    common_pb2.ROLE_TOOL,
)
CONVERSATION = [
    (S, "You are terse."),
    (U, "Hi 👋 what is 中文?"),
    (A, "Chinese."),
    (U, "Thanks!"),
]


def chat(*turns: tuple[Any, str]) -> list[common_pb2.ChatMessage]:
    return [common_pb2.ChatMessage(role=role, content=content) for role, content in turns]


@pytest.fixture(scope="module")
def registry(demo_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Registry:
    """The demo model plus `plain`: the demo tokenizer without a chat template."""
    root = tmp_path_factory.mktemp("models")
    plain = root / "plain"
    plain.mkdir()
    (plain / "tokenizer.json").write_bytes((demo_model_dir / "tokenizer.json").read_bytes())
    (plain / "tokenizer_config.json").write_text('{"eos_token": "<|eos|>"}', encoding="utf-8")
    (root / "models.yaml").write_text(
        f"models:\n  - name: {DEMO}\n    aliases: [demo]\n    checkpoint: {demo_model_dir}\n"
        "    context_length: 2048\n  - name: plain\n    checkpoint: plain\n",
        encoding="utf-8",
    )
    return load_registry(load_catalog(root / "models.yaml", root))


@pytest.fixture(scope="module")
def literal_tokenizer(demo_tokenizer: Tokenizer) -> Tokenizer:
    """The demo tokenizer encoding special-token text as text, as the service does."""
    literal = Tokenizer.from_str(demo_tokenizer.to_str())
    literal.encode_special_tokens = True
    return literal


@pytest.fixture
async def server(registry: Registry) -> AsyncIterator[RunningServer]:
    spec = build_spec(registry, LIMITS)
    async with running_server(spec, settings=settings_for_tests("tokenizer")) as running:
        yield running


@pytest.fixture
def stub(server: RunningServer) -> pb_grpc.TokenizerServiceAsyncStub:
    return pb_grpc.TokenizerServiceStub(server.channel)


async def test_health_is_serving(server: RunningServer) -> None:
    health = health_pb2_grpc.HealthStub(server.channel)
    for service in ("", SERVICE_NAME):
        reply = await health.Check(health_pb2.HealthCheckRequest(service=service))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_encode_decode_round_trip(
    stub: pb_grpc.TokenizerServiceAsyncStub, literal_tokenizer: Tokenizer
) -> None:
    encoded = await stub.Encode(pb.EncodeRequest(model=DEMO, texts=UNICODE_TEXTS))
    ids = [list(e.ids) for e in encoded.encodings]
    assert ids == [
        e.ids for e in literal_tokenizer.encode_batch(UNICODE_TEXTS, add_special_tokens=False)
    ]
    assert encoded.total_tokens == sum(map(len, ids))
    decoded = await stub.Decode(pb.DecodeRequest(model=DEMO, sequences=encoded.encodings))
    assert list(decoded.texts) == UNICODE_TEXTS


async def test_special_tokens_added_and_skipped(
    stub: pb_grpc.TokenizerServiceAsyncStub, demo_tokenizer: Tokenizer
) -> None:
    bos = demo_tokenizer.token_to_id("<|bos|>")
    request = pb.EncodeRequest(model="demo", texts=["Hi"], add_special_tokens=True)
    encoded = await stub.Encode(request)
    assert encoded.encodings[0].ids[0] == bos
    for skip, expected in ((False, "<|bos|>Hi"), (True, "Hi")):
        request_d = pb.DecodeRequest(
            model=DEMO, sequences=encoded.encodings, skip_special_tokens=skip
        )
        assert (await stub.Decode(request_d)).texts == [expected]


@pytest.fixture(scope="module")
def corpus_texts() -> list[str]:
    """64 paragraphs of the demo corpus (prose, code, numbers, many scripts)."""
    corpus = Path(__file__).resolve().parents[4] / "infra" / "model" / "corpus"
    paragraphs = [p for f in sorted(corpus.glob("*.txt")) for p in f.read_text().split("\n\n")]
    texts = [p[:4000] for p in paragraphs if p.strip()]
    return (texts * (64 // len(texts) + 1))[:64]


async def test_batch_equals_in_process_tokenizers(
    stub: pb_grpc.TokenizerServiceAsyncStub, demo_tokenizer: Tokenizer, corpus_texts: list[str]
) -> None:
    texts = corpus_texts
    for add in (False, True):
        reply = await stub.Encode(pb.EncodeRequest(model=DEMO, texts=texts, add_special_tokens=add))
        expected = [e.ids for e in demo_tokenizer.encode_batch(texts, add_special_tokens=add)]
        assert [list(e.ids) for e in reply.encodings] == expected
    sequences = [pb.TokenIds(ids=ids) for ids in expected]
    reply_d = await stub.Decode(pb.DecodeRequest(model=DEMO, sequences=sequences))
    assert list(reply_d.texts) == demo_tokenizer.decode_batch(expected, skip_special_tokens=False)


async def test_concurrent_requests(
    stub: pb_grpc.TokenizerServiceAsyncStub, literal_tokenizer: Tokenizer
) -> None:
    texts = [f"request {i}: {UNICODE_TEXTS[i % len(UNICODE_TEXTS)]}" for i in range(32)]
    replies = await asyncio.gather(
        *(stub.Encode(pb.EncodeRequest(model=DEMO, texts=[t])) for t in texts)
    )
    for text, reply in zip(texts, replies, strict=True):
        assert (
            list(reply.encodings[0].ids)
            == literal_tokenizer.encode(text, add_special_tokens=False).ids
        )


@pytest.mark.parametrize("add_generation_prompt", [False, True])
async def test_chat_template_equals_transformers(
    stub: pb_grpc.TokenizerServiceAsyncStub, demo_model_dir: Path, add_generation_prompt: bool
) -> None:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(demo_model_dir))
    conversation = [
        {"role": ("", "system", "user", "assistant")[role], "content": content}
        for role, content in CONVERSATION
    ]
    expected_prompt = hf.apply_chat_template(
        conversation, add_generation_prompt=add_generation_prompt, tokenize=False
    )
    expected_ids = hf.apply_chat_template(
        conversation, add_generation_prompt=add_generation_prompt, tokenize=True, return_dict=False
    )
    request = pb.ApplyChatTemplateRequest(
        model=DEMO, messages=chat(*CONVERSATION), add_generation_prompt=add_generation_prompt
    )
    reply = await stub.ApplyChatTemplate(request)
    assert reply.prompt == expected_prompt
    assert list(reply.token_ids) == list(expected_ids)
    assert not reply.default_template
    assert list(reply.token_ids).count(hf.bos_token_id) == 1


async def test_default_template(stub: pb_grpc.TokenizerServiceAsyncStub) -> None:
    request = pb.ApplyChatTemplateRequest(model="plain", messages=chat((U, "Hi")))
    reply = await stub.ApplyChatTemplate(request)
    assert reply.default_template
    assert reply.prompt == "<|im_start|>user\nHi<|im_end|>\n"


async def test_default_template_with_tools(stub: pb_grpc.TokenizerServiceAsyncStub) -> None:
    tools = [
        common_pb2.Tool(
            type="function",
            function=common_pb2.FunctionDefinition(
                name="now", description="The time", parameters_json='{"type": "object"}'
            ),
        )
    ]
    call = common_pb2.ToolCall(
        id="call_1", function=common_pb2.FunctionCall(name="now", arguments="{}")
    )
    messages = [
        *chat((U, "Time?")),
        common_pb2.ChatMessage(role=A, tool_calls=[call]),
        common_pb2.ChatMessage(role=T, content="12:00", tool_call_id="call_1"),
    ]
    reply = await stub.ApplyChatTemplate(
        pb.ApplyChatTemplateRequest(
            model="plain", messages=messages, tools=tools, add_generation_prompt=True
        )
    )
    tool_json = '{"type": "function", "function": {"name": "now", "description": "The time", '
    assert f'<tools>\n{tool_json}"parameters": {{"type": "object"}}}}}}\n</tools>' in reply.prompt
    assert '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>' in reply.prompt
    assert "<tool_response>\n12:00\n</tool_response>" in reply.prompt
    counted = await stub.CountTokens(
        pb.CountTokensRequest(model="plain", messages=messages, tools=tools)
    )
    assert counted.total == len(reply.token_ids)


async def test_count_tokens(
    stub: pb_grpc.TokenizerServiceAsyncStub, literal_tokenizer: Tokenizer
) -> None:
    texts = UNICODE_TEXTS
    reply = await stub.CountTokens(pb.CountTokensRequest(model=DEMO, texts=texts))
    expected = [len(e.ids) for e in literal_tokenizer.encode_batch(texts, add_special_tokens=False)]
    assert list(reply.counts) == expected
    assert reply.total == sum(expected)
    messages = chat(*CONVERSATION)
    reply = await stub.CountTokens(pb.CountTokensRequest(model=DEMO, messages=messages))
    templated = await stub.ApplyChatTemplate(
        pb.ApplyChatTemplateRequest(model=DEMO, messages=messages, add_generation_prompt=True)
    )
    assert list(reply.counts) == []
    assert reply.total == len(templated.token_ids)


async def test_info(
    stub: pb_grpc.TokenizerServiceAsyncStub, demo_tokenizer: Tokenizer, registry: Registry
) -> None:
    info = await stub.Info(pb.InfoRequest(model="demo"))
    assert info.model == DEMO
    assert info.vocab_size == demo_tokenizer.get_vocab_size(with_added_tokens=True)
    assert info.max_context == 2048
    assert (info.bos.text, info.bos.id) == ("<|bos|>", demo_tokenizer.token_to_id("<|bos|>"))
    assert (info.eos.text, info.eos.id) == ("<|eos|>", demo_tokenizer.token_to_id("<|eos|>"))
    assert (info.pad.text, info.pad.id) == ("<|pad|>", demo_tokenizer.token_to_id("<|pad|>"))
    assert {t.text for t in info.special_tokens} >= {"<|system|>", "<|user|>", "<|assistant|>"}
    assert info.has_chat_template
    plain = await stub.Info(pb.InfoRequest(model="plain"))
    assert not plain.has_chat_template
    assert not plain.HasField("bos")
    assert plain.HasField("eos")
    # What a router compares with its own copy's (llm_router.attestation): the loaded files'.
    demo, other = registry.get(DEMO), registry.get("plain")
    assert demo is not None
    assert other is not None
    assert info.fingerprint == demo.fingerprint
    assert plain.fingerprint == other.fingerprint != info.fingerprint


def _call(stub: pb_grpc.TokenizerServiceAsyncStub, rpc: str) -> Callable[[Any], Any]:
    method: Callable[[Any], Any] = getattr(stub, rpc)
    return method


TOO_LONG = "é" * 2049  # 4098 bytes > 4096
INVALID_ARGUMENT_CASES: list[tuple[str, Any, list[str]]] = [
    ("Encode", pb.EncodeRequest(model=DEMO), ["texts"]),
    ("Encode", pb.EncodeRequest(texts=["x"]), ["model"]),
    ("Encode", pb.EncodeRequest(model=DEMO, texts=["x"] * 65), ["texts"]),
    (
        "Encode",
        pb.EncodeRequest(model=DEMO, texts=["ok", TOO_LONG, "ok", TOO_LONG]),
        ["texts[1]", "texts[3]"],
    ),
    ("Decode", pb.DecodeRequest(model=DEMO), ["sequences"]),
    (
        "Decode",
        pb.DecodeRequest(
            model=DEMO,
            sequences=[
                pb.TokenIds(ids=[1, 2]),
                pb.TokenIds(ids=[3, 4, 10**6]),
                pb.TokenIds(ids=[-5]),
            ],
        ),
        ["sequences[1].ids[2]", "sequences[2].ids[0]"],
    ),
    (
        "Decode",
        pb.DecodeRequest(model=DEMO, sequences=[pb.TokenIds(ids=[1] * 4097)]),
        ["sequences[0].ids"],
    ),
    ("ApplyChatTemplate", pb.ApplyChatTemplateRequest(model=DEMO), ["messages"]),
    (
        "ApplyChatTemplate",
        pb.ApplyChatTemplateRequest(model=DEMO, messages=chat((U, "a"), (0, "b"), (42, "c"))),
        ["messages[1].role", "messages[2].role"],
    ),
    (
        "ApplyChatTemplate",
        pb.ApplyChatTemplateRequest(model=DEMO, messages=chat(*[(U, "a")] * 9)),
        ["messages"],
    ),
    (
        "ApplyChatTemplate",
        pb.ApplyChatTemplateRequest(model=DEMO, messages=chat((U, TOO_LONG))),
        ["messages"],
    ),
    # The demo template rejects the tool role with raise_exception.
    (
        "ApplyChatTemplate",
        pb.ApplyChatTemplateRequest(model=DEMO, messages=chat((T, "42"))),
        ["messages"],
    ),
    ("CountTokens", pb.CountTokensRequest(model=DEMO), ["texts"]),
    (
        "CountTokens",
        pb.CountTokensRequest(model=DEMO, texts=["a"], messages=chat((U, "b"))),
        ["messages"],
    ),
    ("CountTokens", pb.CountTokensRequest(model=DEMO, texts=[TOO_LONG]), ["texts[0]"]),
    (
        "CountTokens",
        pb.CountTokensRequest(model=DEMO, messages=chat((0, "b"))),
        ["messages[0].role"],
    ),
    (
        "ApplyChatTemplate",
        pb.ApplyChatTemplateRequest(
            model=DEMO,
            messages=chat((U, "a")),
            tools=[
                common_pb2.Tool(function=common_pb2.FunctionDefinition(name="bad name")),
                common_pb2.Tool(
                    function=common_pb2.FunctionDefinition(name="f", parameters_json="[")
                ),
            ],
        ),
        ["tools[0].function.name", "tools[1].function.parameters_json"],
    ),
    (
        "CountTokens",
        pb.CountTokensRequest(
            model=DEMO,
            texts=["a"],
            tools=[common_pb2.Tool(function=common_pb2.FunctionDefinition(name="f"))],
        ),
        ["tools"],
    ),
    ("Info", pb.InfoRequest(), ["model"]),
]


@pytest.mark.parametrize(("rpc", "request_", "fields"), INVALID_ARGUMENT_CASES)
async def test_invalid_argument(
    server: RunningServer,
    stub: pb_grpc.TokenizerServiceAsyncStub,
    rpc: str,
    request_: Any,
    fields: list[str],
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _call(stub, rpc)(request_)
    error = parse_error(info.value)
    assert error.code == grpc.StatusCode.INVALID_ARGUMENT
    assert [v.field for v in error.field_violations] == fields
    assert all(isinstance(v, FieldViolation) and v.description for v in error.field_violations)
    await _assert_still_serving(server, stub)


async def test_template_error_message_reaches_the_client(
    stub: pb_grpc.TokenizerServiceAsyncStub,
) -> None:
    request = pb.ApplyChatTemplateRequest(model=DEMO, messages=chat((T, "42")))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.ApplyChatTemplate(request)
    violation = parse_error(info.value).field_violations[0]
    assert violation.description == "A tool message must answer a call (tool_call_id)"


async def test_out_of_vocabulary_description(stub: pb_grpc.TokenizerServiceAsyncStub) -> None:
    info_reply = await stub.Info(pb.InfoRequest(model=DEMO))
    vocab = info_reply.vocab_size
    request = pb.DecodeRequest(model=DEMO, sequences=[pb.TokenIds(ids=[0, vocab])])
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await stub.Decode(request)
    violation = parse_error(info.value).field_violations[0]
    assert violation == FieldViolation(
        "sequences[0].ids[1]", f"{vocab} is outside the vocabulary [0, {vocab})"
    )


@pytest.mark.parametrize(
    ("rpc", "request_"),
    [
        ("Encode", pb.EncodeRequest(model="nope", texts=["x"])),
        ("Decode", pb.DecodeRequest(model="nope", sequences=[pb.TokenIds(ids=[1])])),
        ("ApplyChatTemplate", pb.ApplyChatTemplateRequest(model="nope", messages=chat((U, "x")))),
        ("CountTokens", pb.CountTokensRequest(model="nope", texts=["x"])),
        ("Info", pb.InfoRequest(model="nope")),
    ],
)
async def test_unknown_model_is_not_found(
    server: RunningServer, stub: pb_grpc.TokenizerServiceAsyncStub, rpc: str, request_: Any
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await _call(stub, rpc)(request_)
    error = parse_error(info.value)
    assert error.code == grpc.StatusCode.NOT_FOUND
    assert error.resource == ("model", "nope")
    await _assert_still_serving(server, stub)


async def _assert_still_serving(
    server: RunningServer, stub: pb_grpc.TokenizerServiceAsyncStub
) -> None:
    health = health_pb2_grpc.HealthStub(server.channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE_NAME))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    encoded = await stub.Encode(pb.EncodeRequest(model=DEMO, texts=["still here"]))
    assert len(encoded.encodings[0].ids) > 0
