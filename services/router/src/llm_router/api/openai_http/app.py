"""The OpenAI-compatible endpoints, each a thin translation onto one LLMService call."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from opentelemetry import propagate, trace

from llm_router.api.openai_http import chunks, responses, translate
from llm_router.api.openai_http.errors import SERVER, OpenAIError, from_rpc_error
from llm_router.api.openai_http.in_process import InProcessLLMService
from llm_router.api.openai_http.wire import HttpRequest, ResponseWriter
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc

# What the edge put on the request and the router reads (identity after ext_authz, the
# request id and region preference). Trace context travels through the client interceptor.
FORWARDED_HEADERS = (
    "x-tenant-id",
    "x-key-id",
    "x-scopes",
    "x-credential-type",
    "x-allowed-models",
    "x-request-id",
)
SSE_HEADERS = {"content-type": "text/event-stream", "cache-control": "no-cache"}
Handler = Callable[[HttpRequest, ResponseWriter], Awaitable[None]]
# LLMService in this process (the router's own), or over gRPC (a translator hosted apart).
LLMCalls = InProcessLLMService | pb_grpc.LLMServiceStub
_tracer = trace.get_tracer(__name__)


class OpenAIApp:
    """Routes /v1/ requests; every answer, errors included, is OpenAI-shaped JSON or SSE."""

    def __init__(self, stub: LLMCalls, region_header: str = "x-llm-region") -> None:
        self._stub = stub
        self._forwarded = (*FORWARDED_HEADERS, region_header)
        self._routes: dict[tuple[str, str], Handler] = {
            ("POST", "/v1/chat/completions"): self._chat,
            ("POST", "/v1/completions"): self._complete,
            ("POST", "/v1/embeddings"): self._embed,
            ("GET", "/v1/models"): self._models,
        }

    async def handle(self, request: HttpRequest, out: ResponseWriter) -> None:
        parent = propagate.extract(request.headers)
        name = f"{request.method} {request.path}"
        with _tracer.start_as_current_span(name, context=parent, kind=trace.SpanKind.SERVER):
            try:
                await self._route(request)(request, out)
            except OpenAIError as err:
                if not out.started:
                    await out.send_json(err.status, err.body(), err.headers)

    def _route(self, request: HttpRequest) -> Handler:
        handler = self._routes.get((request.method, request.path))
        if handler is not None:
            return handler
        if request.method == "GET" and request.path.startswith("/v1/models/"):
            return self._model
        allowed = sorted(m for m, p in self._routes if p == request.path)
        if allowed:
            raise OpenAIError(
                405,
                f"method {request.method} is not allowed on {request.path}",
                headers={"allow": ", ".join(allowed)},
            )
        raise OpenAIError(404, f"Invalid URL ({request.method} {request.path})", code="unknown_url")

    def _metadata(self, request: HttpRequest) -> tuple[tuple[str, str], ...]:
        headers = request.headers
        return tuple((name, headers[name]) for name in self._forwarded if name in headers)

    async def _unary(self, method: Any, message: Any, request: HttpRequest) -> Any:
        try:
            return await method(message, metadata=self._metadata(request))
        except grpc.RpcError as err:
            raise from_rpc_error(err) from None

    async def _chat(self, request: HttpRequest, out: ResponseWriter) -> None:
        call = translate.chat_call(translate.parse_body(request.body))
        if call.stream:
            stream = self._stub.ChatStream(
                pb.ChatStreamRequest(**call.fields), metadata=self._metadata(request)
            )
            await _stream(stream, out, chunks.ChunkMaker(chat=True), call.include_usage)
            return
        reply = await self._unary(self._stub.Chat, pb.ChatRequest(**call.fields), request)
        await out.send_json(200, responses.chat_completion(reply))

    async def _complete(self, request: HttpRequest, out: ResponseWriter) -> None:
        call = translate.completion_call(translate.parse_body(request.body))
        if call.stream:
            stream = self._stub.CompleteStream(
                pb.CompleteStreamRequest(**call.fields), metadata=self._metadata(request)
            )
            await _stream(stream, out, chunks.ChunkMaker(chat=False), call.include_usage)
            return
        reply = await self._unary(self._stub.Complete, pb.CompleteRequest(**call.fields), request)
        await out.send_json(200, responses.text_completion(reply))

    async def _embed(self, request: HttpRequest, out: ResponseWriter) -> None:
        call = translate.embed_call(translate.parse_body(request.body))
        reply = await self._unary(self._stub.Embed, call.request, request)
        await out.send_json(200, responses.embeddings(reply, call.base64))

    async def _models(self, request: HttpRequest, out: ResponseWriter) -> None:
        reply = await self._unary(self._stub.ListModels, pb.ListModelsRequest(), request)
        await out.send_json(200, responses.model_list(reply))

    async def _model(self, request: HttpRequest, out: ResponseWriter) -> None:
        wanted = request.path.removeprefix("/v1/models/")
        reply = await self._unary(self._stub.ListModels, pb.ListModelsRequest(), request)
        for model in reply.models:
            if wanted in (model.name, *model.aliases):
                await out.send_json(200, responses.model_entry(wanted))
                return
        raise OpenAIError(
            404,
            f"The model {wanted!r} does not exist",
            "not_found_error",
            "model",
            "model_not_found",
        )


async def _stream(
    call: Any, out: ResponseWriter, maker: chunks.ChunkMaker, include_usage: bool
) -> None:
    """Relay a server stream as SSE ending in [DONE]. Errors before the first message are
    HTTP errors; later ones an `error` event (an HTTP status can no longer change)."""
    try:
        async for message in call:
            if not out.started:
                await out.start(200, SSE_HEADERS)
                await out.chunk(maker.first(message))
            await out.chunk(maker.piece(message))
    except grpc.RpcError as err:
        if not out.started:
            raise from_rpc_error(err) from None
        await out.chunk(responses.sse(from_rpc_error(err).body()))
        await out.end()
        return
    except BaseException:
        call.cancel()  # the client went away (or we are stopping): stop generating
        raise
    if not out.started:  # a stream without any message: the router broke its contract
        raise OpenAIError(502, "the generation ended without an answer", SERVER)
    if include_usage:
        await out.chunk(maker.usage_chunk())
    await out.chunk(responses.DONE)
    await out.end()
