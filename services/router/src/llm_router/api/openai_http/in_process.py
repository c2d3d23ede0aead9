"""LLMService called inside the router's process: the OpenAI front end reaches the servicer
through the same interceptor the gRPC server runs (span, request id, deadline, `llm_rpc_*`
metrics, access log, ServiceError → rich status), minus the loopback gRPC hop (a protobuf
round trip and an HTTP/2 exchange on every request). Failures come back as a grpc.RpcError
carrying the status the gRPC hop would have delivered, so the HTTP layer maps them as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, cast

import grpc
from opentelemetry import propagate

from llm_common.interceptors import CallInterceptor
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["LLMService"].full_name
Metadata = Sequence[tuple[str, str]]
Trailers = Sequence[tuple[str, str | bytes]]  # grpc-status-details-bin is bytes
PEER = "in-process:openai-http"  # what the access log shows instead of a loopback address


class CallFailed(grpc.RpcError):
    """The status an in-process call ended with, read as a failed gRPC call's."""

    def __init__(
        self, code: grpc.StatusCode, details: str, trailing_metadata: Trailers = ()
    ) -> None:
        super().__init__(details)
        self._code, self._details, self._trailing = code, details, tuple(trailing_metadata)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details

    def trailing_metadata(self) -> tuple[Any, ...]:  # (key, value) pairs
        return self._trailing


class _Context:
    """The part of grpc.aio.ServicerContext the interceptor and LLMServicer use."""

    def __init__(self, metadata: Metadata) -> None:
        self._metadata = tuple(metadata)
        self._code: grpc.StatusCode | None = None

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def time_remaining(self) -> float | None:
        return None  # as the loopback call, which carried no deadline

    def peer(self) -> str:
        return PEER

    def code(self) -> grpc.StatusCode | None:
        return self._code

    async def abort(
        self, code: grpc.StatusCode, details: str = "", trailing_metadata: Trailers = ()
    ) -> None:
        self._code = code
        raise CallFailed(code, details, trailing_metadata)

    async def abort_with_status(self, status: grpc.Status) -> None:
        await self.abort(status.code, status.details, status.trailing_metadata)


@dataclass(frozen=True, slots=True)
class _CallDetails:
    method: str
    invocation_metadata: Metadata


class InProcessStream:
    """A server stream read in the caller's task; `cancel()` ends it as a client's cancel
    ends a gRPC stream (the servicer's generator is closed: the generation stops and
    settles what it produced)."""

    def __init__(self, responses: AsyncIterator[Any]) -> None:
        self._responses = responses
        self._closing: asyncio.Task[None] | None = None

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._responses

    def cancel(self) -> None:
        close = getattr(self._responses, "aclose", None)
        if close is not None and self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(close())
            self._closing.add_done_callback(_retrieve)


class InProcessLLMService:
    """LLMService's methods, shaped as the gRPC stub's, on a servicer in this process."""

    def __init__(
        self, servicer: pb_grpc.LLMServiceServicer, logged_methods: frozenset[str] = frozenset()
    ) -> None:
        # One handler per method, made once: the interceptor wraps each once and reuses it.
        self._handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            name: grpc.unary_unary_rpc_method_handler(getattr(servicer, name))
            for name in ("Chat", "Complete", "Embed", "ListModels")
        } | {
            name: grpc.unary_stream_rpc_method_handler(getattr(servicer, name))
            for name in ("ChatStream", "CompleteStream")
        }
        # The server's own interceptor class with the server's settings: the same metrics,
        # access log and error mapping as a call over the port.
        self._interceptor = CallInterceptor(logged_methods=logged_methods)

    async def Chat(self, request: pb.ChatRequest, *, metadata: Metadata) -> pb.ChatResponse:  # noqa: N802
        return cast(pb.ChatResponse, await self._unary("Chat", request, metadata))

    async def Complete(  # noqa: N802
        self, request: pb.CompleteRequest, *, metadata: Metadata
    ) -> pb.CompleteResponse:
        return cast(pb.CompleteResponse, await self._unary("Complete", request, metadata))

    async def Embed(self, request: pb.EmbedRequest, *, metadata: Metadata) -> pb.EmbedResponse:  # noqa: N802
        return cast(pb.EmbedResponse, await self._unary("Embed", request, metadata))

    async def ListModels(  # noqa: N802
        self, request: pb.ListModelsRequest, *, metadata: Metadata
    ) -> pb.ListModelsResponse:
        return cast(pb.ListModelsResponse, await self._unary("ListModels", request, metadata))

    def ChatStream(  # noqa: N802
        self, request: pb.ChatStreamRequest, *, metadata: Metadata
    ) -> InProcessStream:
        return InProcessStream(self._stream("ChatStream", request, metadata))

    def CompleteStream(  # noqa: N802
        self, request: pb.CompleteStreamRequest, *, metadata: Metadata
    ) -> InProcessStream:
        return InProcessStream(self._stream("CompleteStream", request, metadata))

    async def _unary(self, name: str, request: Any, metadata: Metadata) -> Any:
        metadata = _with_trace_context(metadata)
        handler = await self._handler(name, metadata)
        return await handler.unary_unary(request, _Context(metadata))

    async def _stream(self, name: str, request: Any, metadata: Metadata) -> AsyncIterator[Any]:
        metadata = _with_trace_context(metadata)
        handler = await self._handler(name, metadata)
        async with aclosing(handler.unary_stream(request, _Context(metadata))) as responses:
            async for response in responses:
                yield response

    async def _handler(self, name: str, metadata: Metadata) -> Any:
        own = self._handlers[name]

        async def continuation(_: Any) -> Any:
            return own

        details = _CallDetails(f"/{SERVICE_NAME}/{name}", metadata)
        return await self._interceptor.intercept_service(continuation, cast(Any, details))


def _with_trace_context(metadata: Metadata) -> tuple[tuple[str, str], ...]:
    # What the gRPC client interceptor sent: the HTTP span's context, so the servicer's span
    # continues the same trace.
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return (*metadata, *carrier.items())


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()
