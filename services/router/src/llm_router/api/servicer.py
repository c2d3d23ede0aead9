"""LLMServicer: parse and validate, call the pipeline, build responses (no logic of its own)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncGenerator, AsyncIterator, Iterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from google.protobuf import timestamp_pb2

from llm_common.context_tokens import restore
from llm_common.deadlines import deadline_after, deadline_var
from llm_common.errors import FieldViolation, InvalidArgument
from llm_common.interceptors import new_request_id
from llm_common.logging import current_request_id
from llm_common.tools import parser_for
from llm_router.api import validation
from llm_router.api.identity import SCOPE_COMPLETION, SCOPE_EMBEDDING, Caller, caller_from_metadata
from llm_router.background import Background
from llm_router.config import Limits
from llm_router.embedder import Embedder
from llm_router.generation.answers import Answer, fill_chat, fill_completion
from llm_router.generation.choices import choice_requests, interleaved, merged_usage
from llm_router.generation.relay import Chunk, Generation
from llm_router.generation.tool_calls import ToolCallReader, call_deltas
from llm_router.pipeline import Pipeline
from llm_router.requests import GenerationRequest
from llm_router.routing.models import AUTO_MODEL, GENERATION, ModelRouter
from llm_router.safety.policies import PolicyBook
from llm_router.tokens.prompt import PromptTokenizer
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc

# The chat and completion streams share one message shape under two names.
StreamMessage = TypeVar("StreamMessage", pb.ChatStreamResponse, pb.CompleteStreamResponse)

Context = grpc.aio.ServicerContext[Any, Any]
_CACHE_HITS = {
    "miss": pb.CACHE_HIT_MISS,
    "exact": pb.CACHE_HIT_EXACT,
    "semantic": pb.CACHE_HIT_SEMANTIC,
}
_KINDS = {
    "generation": common_pb2.MODEL_KIND_GENERATION,
    "embedding": common_pb2.MODEL_KIND_EMBEDDING,
}


@dataclass(frozen=True, slots=True)
class ServiceDeps:
    """What the servicer delegates to."""

    pipeline: Pipeline
    embedder: Embedder
    router: ModelRouter
    tokenizer: PromptTokenizer
    policies: PolicyBook
    background: Background
    limits: Limits = field(default_factory=Limits)
    region_header: str = "x-llm-region"
    request_timeout_s: float = 300.0


@dataclass(frozen=True, slots=True)
class _Emitted:
    """A chunk of choice `index`; `first` on the choice's first chunk."""

    index: int
    generation: Generation
    chunk: Chunk
    first: bool


class LLMServicer(pb_grpc.LLMServiceServicer):
    """llmapi.llm.v1.LLMService."""

    def __init__(self, deps: ServiceDeps) -> None:
        self._deps = deps

    # Method names are the contract's RPC names, hence the noqa N802.
    async def Chat(self, request: pb.ChatRequest, context: Context) -> pb.ChatResponse:  # noqa: N802
        parsed = validation.validate_chat(request, self._deps.limits)
        answers, generation = await self._unary(parsed, context)
        response = pb.ChatResponse(
            request_id=generation.request_id,
            model=generation.model,
            cache=_cache_info(generation),
            created=_now(),
        )
        fill_chat(response, answers)
        return response

    async def ChatStream(  # noqa: N802
        self, request: pb.ChatStreamRequest, context: Context
    ) -> AsyncIterator[pb.ChatStreamResponse]:
        parsed = validation.validate_chat(request, self._deps.limits)
        async for message in self._stream_messages(parsed, context, pb.ChatStreamResponse):
            yield message

    async def Complete(  # noqa: N802
        self, request: pb.CompleteRequest, context: Context
    ) -> pb.CompleteResponse:
        parsed = validation.validate_complete(request, self._deps.limits)
        answers, generation = await self._unary(parsed, context)
        response = pb.CompleteResponse(
            request_id=generation.request_id,
            model=generation.model,
            cache=_cache_info(generation),
            created=_now(),
        )
        fill_completion(response, answers)
        return response

    async def CompleteStream(  # noqa: N802
        self, request: pb.CompleteStreamRequest, context: Context
    ) -> AsyncIterator[pb.CompleteStreamResponse]:
        parsed = validation.validate_complete(request, self._deps.limits)
        async for message in self._stream_messages(parsed, context, pb.CompleteStreamResponse):
            yield message

    async def Embed(self, request: pb.EmbedRequest, context: Context) -> pb.EmbedResponse:  # noqa: N802
        parsed = validation.validate_embed(request, self._deps.limits)
        caller = self._caller(context)
        request_id = _request_id(parsed.request_id)
        with self._deadline():
            result = await self._deps.embedder.embed(parsed, caller, request_id)
        response = pb.EmbedResponse(request_id=request_id, model=result.model, usage=result.usage)
        for index, values in enumerate(result.vectors):
            response.embeddings.add(index=index, values=values)
        return response

    async def CountTokens(  # noqa: N802
        self, request: pb.CountTokensRequest, context: Context
    ) -> pb.CountTokensResponse:
        validation.validate_count(request, self._deps.limits)
        caller = self._caller(context)
        caller.require_scope(SCOPE_COMPLETION, SCOPE_EMBEDDING)
        if request.model == AUTO_MODEL:
            raise InvalidArgument(
                [FieldViolation("model", "name a model; `auto` resolves per request")]
            )
        spec = self._deps.router.resolve(request.model, GENERATION)
        policy = self._deps.policies.for_tenant(caller.tenant_id)
        caller.require_model(spec, policy.admission.allowed_tiers)
        with self._deadline():
            if request.messages:
                ids = await self._deps.tokenizer.chat_prompt(
                    spec.name, request.messages, tenant=caller.tenant_id, tools=request.tools
                )
            else:
                ids = await self._deps.tokenizer.encode(
                    spec.name, request.prompt, tenant=caller.tenant_id
                )
        return pb.CountTokensResponse(
            request_id=_request_id(""),
            model=spec.name,
            tokens=len(ids),
            context_length=spec.context_length,
        )

    async def ListModels(  # noqa: N802
        self, request: pb.ListModelsRequest, context: Context
    ) -> pb.ListModelsResponse:
        caller = self._caller(context)
        allowed = self._deps.policies.for_tenant(caller.tenant_id).admission.allowed_tiers
        return pb.ListModelsResponse(
            models=[
                pb.ModelInfo(
                    name=spec.name,
                    aliases=spec.aliases,
                    kind=_KINDS.get(spec.kind, common_pb2.MODEL_KIND_UNSPECIFIED),
                    context_length=spec.context_length,
                    tier=spec.tier,
                    regions=ModelRouter.regions(spec),
                )
                for spec in self._deps.router.visible(caller, allowed)
            ]
        )

    async def _unary(
        self, parsed: GenerationRequest, context: Context
    ) -> tuple[list[Answer], Generation]:
        """Every choice's answer, and the first choice's generation (for ids and cache info)."""
        answers = [Answer() for _ in range(parsed.choices)]
        first: Generation | None = None
        async for emitted in self._stream(parsed, context, stream=False):
            answers[emitted.index].add(emitted.chunk)
            if emitted.index == 0:
                first = emitted.generation
        assert first is not None  # every choice yields at least its last chunk
        return answers, first

    async def _stream_messages(
        self, parsed: GenerationRequest, context: Context, message_type: type[StreamMessage]
    ) -> AsyncIterator[StreamMessage]:
        """The generation as stream messages: usage on the last, cache info on each choice's
        first."""
        usages: list[common_pb2.Usage] = []
        async for emitted in self._stream(parsed, context, stream=True):
            generation, chunk = emitted.generation, emitted.chunk
            if chunk.usage is not None and parsed.choices > 1:
                # One usage for the request (every choice), on its very last message.
                usages.append(chunk.usage)
                usage = merged_usage(usages) if len(usages) == parsed.choices else None
                chunk = dataclasses.replace(chunk, usage=usage)
            message = message_type(
                request_id=generation.request_id,
                model=generation.model,
                delta=chunk.text,
                logprobs=chunk.logprobs,
                finish_reason=chunk.finish_reason,
                index=emitted.index,
            )
            if chunk.tool_calls and isinstance(message, pb.ChatStreamResponse):
                message.tool_calls.extend(call_deltas(chunk.tool_calls))
            if chunk.usage is not None:
                message.usage.CopyFrom(chunk.usage)
            if emitted.first:
                message.cache.CopyFrom(_cache_info(generation))
            yield message

    async def _stream(
        self, parsed: GenerationRequest, context: Context, *, stream: bool
    ) -> AsyncIterator[_Emitted]:
        caller = self._caller(context)
        with self._deadline():
            generations = await self._open_all(parsed, caller, stream=stream)
            streams = [self._read(parsed, g, i) for i, g in enumerate(generations)]
            if len(streams) == 1:
                async with aclosing(streams[0]) as only:
                    async for emitted in only:
                        yield emitted
                return
            async for tagged in interleaved(streams):
                yield tagged.item

    async def _read(
        self, parsed: GenerationRequest, generation: Generation, index: int
    ) -> AsyncGenerator[_Emitted, None]:
        """One choice's chunks, read for tool calls when the request offers tools."""
        reader = self._tool_reader(parsed, generation, index)
        first = True
        async with aclosing(self._chunks(generation)) as chunks:
            async for chunk in chunks:
                read = reader.read(chunk) if reader is not None else chunk
                yield _Emitted(index, generation, read, first)
                first = False

    def _tool_reader(
        self, parsed: GenerationRequest, generation: Generation, index: int
    ) -> ToolCallReader | None:
        if not parsed.parses_tool_calls:
            return None
        spec = self._deps.router.resolve(generation.model, GENERATION)
        return ToolCallReader(parser_for(spec.tool_parser), f"{generation.request_id}/{index}")

    async def _open_all(
        self, parsed: GenerationRequest, caller: Caller, *, stream: bool
    ) -> list[Generation]:
        """A generation per choice; if any fails to open, the others are closed."""
        requests = choice_requests(parsed)
        if len(requests) == 1:
            return [await self._open(parsed, caller, stream=stream)]
        request_id = _request_id(parsed.request_id)
        # The first choice is placed (and its prompt prefilled) before the others start: prefix
        # affinity then sends them to its replica, whose prefix cache holds the prompt's blocks.
        first = await self._deps.pipeline.open(
            requests[0], caller, request_id=request_id, stream=stream
        )
        opening = [
            asyncio.ensure_future(
                self._deps.pipeline.open(r, caller, request_id=request_id, stream=stream)
            )
            for r in requests[1:]
        ]
        try:
            return [first, *await asyncio.gather(*opening)]
        except BaseException:
            for task in opening:
                task.cancel()
            await asyncio.gather(*opening, return_exceptions=True)
            first.abandon()
            for task in opening:
                if not task.cancelled() and task.exception() is None:
                    task.result().abandon()
            raise

    async def _chunks(self, generation: Generation) -> AsyncGenerator[Chunk, None]:
        """The generation's chunks. Once the last one is out, closing the generation
        (settlement, cache store, metrics, access log) runs in the background, so the call
        completes without waiting for it; a call that ends early closes it before ending."""
        chunks = generation.chunks()
        finished = False
        try:
            async for chunk in chunks:
                yield chunk
                if chunk.usage is not None:  # the last chunk
                    finished = True
                    return
        finally:
            if finished:
                self._deps.background.spawn(_close(chunks, generation))
            else:
                await _close(chunks, generation)

    async def _open(self, parsed: GenerationRequest, caller: Caller, *, stream: bool) -> Generation:
        request_id = _request_id(parsed.request_id)
        return await self._deps.pipeline.open(parsed, caller, request_id=request_id, stream=stream)

    def _caller(self, context: Context) -> Caller:
        return caller_from_metadata(context.invocation_metadata(), self._deps.region_header)

    @contextlib.contextmanager
    def _deadline(self) -> Iterator[None]:
        """Bound downstream calls by request_timeout_s when the caller set no deadline."""
        if deadline_var.get() is not None:
            yield
            return
        token = deadline_var.set(deadline_after(self._deps.request_timeout_s))
        try:
            yield
        finally:
            restore(token)  # a cancelled stream may end in another context


async def _close(chunks: AsyncGenerator[Chunk, None], generation: Generation) -> None:
    try:
        await chunks.aclose()
    finally:
        generation.abandon()


def _cache_info(generation: Generation) -> pb.CacheInfo:
    return pb.CacheInfo(
        hit=_CACHE_HITS.get(generation.cache_hit, pb.CACHE_HIT_MISS),
        similarity=generation.similarity,
    )


def _request_id(client_id: str) -> str:
    # The client's id when given, else the RPC's x-request-id: one id in logs and response.
    return client_id or current_request_id() or new_request_id()


def _now() -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.GetCurrentTime()
    return ts
