"""The OpenAI listener in front of a scripted LLMService (a real gRPC server on port 0).

The scripted service answers from the request itself so every assertion can be derived:
the reply is the words of the last message reversed; `model` selects failures.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
import pytest_asyncio

from llm_common.errors import (
    FieldViolation,
    InvalidArgument,
    NotFound,
    QuotaExceeded,
    QuotaViolation,
    Unavailable,
)
from llm_common.server import ServiceSpec
from llm_router.api.openai_http import OpenAIHttp, start_openai_http
from llm_router.api.openai_http.in_process import InProcessLLMService
from llm_testing import running_server
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc

SERVICE = "llmapi.llm.v1.LLMService"
MODELS = (("demo-llama", ("demo",)), ("enc", ()))
MAX_TOKENS_LIMIT = 1000


def answer_words(text: str) -> list[str]:
    return list(reversed(text.split()))


@dataclass
class Seen:
    """What the scripted service received: metadata of each call, and cancellations."""

    metadata: list[dict[str, str]] = field(default_factory=list)
    requests: list[Any] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)


class ScriptedLLM(pb_grpc.LLMServiceServicer):
    """model `missing` -> NOT_FOUND, `limited` -> RESOURCE_EXHAUSTED, `down` -> UNAVAILABLE,
    `breaks` -> fails after two chunks, `endless` -> streams until cancelled."""

    def __init__(self) -> None:
        self.seen = Seen()

    def _check(self, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        self.seen.metadata.append(
            {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        )
        self.seen.requests.append(request)
        model = getattr(request, "model", "")
        if model == "missing":
            raise NotFound("model", model)
        if model == "limited":
            raise QuotaExceeded([QuotaViolation("key:k1", "requests per minute")], retry_after_s=4)
        if model == "down":
            raise Unavailable("no replica can serve", retry_after_s=1)
        sampling = getattr(request, "sampling", None)
        if sampling is not None and sampling.max_tokens > MAX_TOKENS_LIMIT:
            raise InvalidArgument(
                [FieldViolation("sampling.max_tokens", f"must be at most {MAX_TOKENS_LIMIT}")]
            )

    @staticmethod
    def _words(request: Any) -> list[str]:
        text = request.messages[-1].content if hasattr(request, "messages") else request.prompt
        return answer_words(text)

    @staticmethod
    def _usage(words: list[str]) -> common_pb2.Usage:
        return common_pb2.Usage(
            prompt_tokens=len(words), completion_tokens=len(words), total_tokens=2 * len(words)
        )

    async def Chat(self, request: pb.ChatRequest, context: Any) -> pb.ChatResponse:  # noqa: N802
        self._check(request, context)
        words = self._words(request)
        return pb.ChatResponse(
            request_id=_request_id(context),
            model="demo-llama",
            message=common_pb2.ChatMessage(role=common_pb2.ROLE_ASSISTANT, content=" ".join(words)),
            finish_reason=common_pb2.FINISH_REASON_STOP,
            usage=self._usage(words),
        )

    async def Complete(self, request: pb.CompleteRequest, context: Any) -> pb.CompleteResponse:  # noqa: N802
        self._check(request, context)
        words = self._words(request)
        return pb.CompleteResponse(
            request_id=_request_id(context),
            model="demo-llama",
            text=" ".join(words),
            finish_reason=common_pb2.FINISH_REASON_LENGTH,
            usage=self._usage(words),
        )

    async def _stream(self, request: Any, context: Any, kind: Any) -> AsyncIterator[Any]:
        self._check(request, context)
        words = self._words(request)
        rid = _request_id(context)
        try:
            if request.model == "endless":
                while True:
                    yield kind(request_id=rid, model="demo-llama", delta="x ")
                    await asyncio.sleep(0.02)
            for i, word in enumerate(words):
                if request.model == "breaks" and i == 2:
                    raise Unavailable("replica lost")
                yield kind(request_id=rid, model="demo-llama", delta=word if i == 0 else f" {word}")
            yield kind(
                request_id=rid,
                model="demo-llama",
                finish_reason=common_pb2.FINISH_REASON_STOP,
                usage=self._usage(words),
            )
        # Cancelled inside this generator, or (when the cancel lands while the server writes
        # what it yielded) closed at its yield: either way the caller went away.
        except (asyncio.CancelledError, GeneratorExit):
            self.seen.cancelled.set()
            raise

    # Async generator functions themselves, so the server's error interceptor maps their errors.
    async def ChatStream(self, request: pb.ChatStreamRequest, context: Any) -> AsyncIterator[Any]:  # noqa: N802
        async for message in self._stream(request, context, pb.ChatStreamResponse):
            yield message

    async def CompleteStream(  # noqa: N802
        self, request: pb.CompleteStreamRequest, context: Any
    ) -> AsyncIterator[Any]:
        async for message in self._stream(request, context, pb.CompleteStreamResponse):
            yield message

    async def Embed(self, request: pb.EmbedRequest, context: Any) -> pb.EmbedResponse:  # noqa: N802
        self._check(request, context)
        vectors = [
            pb.Embedding(index=i, values=[float(len(t)), float(i), 0.5])
            for i, t in enumerate(request.inputs)
        ]
        tokens = sum(len(t.split()) for t in request.inputs)
        return pb.EmbedResponse(
            request_id=_request_id(context),
            model="enc",
            embeddings=vectors,
            usage=common_pb2.Usage(prompt_tokens=tokens, total_tokens=tokens),
        )

    async def ListModels(  # noqa: N802
        self, request: pb.ListModelsRequest, context: Any
    ) -> pb.ListModelsResponse:
        self._check(request, context)
        return pb.ListModelsResponse(
            models=[pb.ModelInfo(name=n, aliases=list(a)) for n, a in MODELS]
        )

    async def CountTokens(  # noqa: N802
        self, request: pb.CountTokensRequest, context: Any
    ) -> pb.CountTokensResponse:
        self._check(request, context)
        return pb.CountTokensResponse(tokens=len(request.prompt.split()))


def _request_id(context: Any) -> str:
    metadata = dict(context.invocation_metadata() or ())
    return str(metadata.get("x-request-id", "generated"))


@dataclass(frozen=True)
class Listener:
    http: OpenAIHttp
    llm: ScriptedLLM

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http.port}/v1"


@pytest_asyncio.fixture(params=["in_process", "grpc"])
async def listener(request: pytest.FixtureRequest) -> AsyncIterator[Listener]:
    """The listener as the router runs it (the servicer called in-process) and as a
    translator hosted apart (over gRPC): every test holds for both."""
    llm = ScriptedLLM()
    if request.param == "in_process":
        http = await start_openai_http("127.0.0.1", 0, InProcessLLMService(llm))
        try:
            yield Listener(http, llm)
        finally:
            await http.close(grace_s=1.0)
        return

    def register(server: grpc.aio.Server) -> None:
        pb_grpc.add_LLMServiceServicer_to_server(llm, server)

    async with running_server(ServiceSpec((SERVICE,), register)) as upstream:
        http = await start_openai_http("127.0.0.1", 0, upstream.target)
        try:
            yield Listener(http, llm)
        finally:
            await http.close(grace_s=1.0)


async def raw_exchange(port: int, data: bytes, timeout_s: float = 5.0) -> bytes:
    """Send raw bytes, read until the server closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        async with asyncio.timeout(timeout_s):
            return await reader.read()
    finally:
        writer.close()
