"""The OpenAI-compatible HTTP/1.1 listener: connections, keep-alive, graceful close."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass

import grpc

from llm_common.channels import make_channel
from llm_common.logging import get_logger
from llm_common.server_tls import ServerTls
from llm_router.api.openai_http.app import OpenAIApp
from llm_router.api.openai_http.errors import OpenAIError
from llm_router.api.openai_http.in_process import InProcessLLMService
from llm_router.api.openai_http.wire import (
    CONTINUE,
    MAX_BODY_BYTES,
    MAX_HEADER_BYTES,
    HttpError,
    ResponseWriter,
    read_request,
)
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc

IDLE_TIMEOUT_S = 75.0  # keep-alive: longer than Envoy's upstream idle check, shorter than forever
_log = get_logger(__name__)


@dataclass(slots=True)
class _Connection:
    busy: bool = False


class OpenAIHttp:
    """A running listener; `port` is the bound port (useful with port 0)."""

    def __init__(
        self, app: OpenAIApp, channel: grpc.aio.Channel | None, max_body_bytes: int
    ) -> None:
        self._app = app
        self._channel = channel
        self._max_body = max_body_bytes
        self._server: asyncio.Server | None = None
        self._connections: dict[asyncio.Task[None], _Connection] = {}
        self.port = 0

    async def _start(self, host: str, port: int, context: ssl.SSLContext | None = None) -> None:
        self._server = await asyncio.start_server(
            self._serve, host, port, limit=MAX_HEADER_BYTES, ssl=context
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        state = self._connections.setdefault(task, _Connection())
        try:
            await self._requests(reader, writer, state)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        finally:
            self._connections.pop(task, None)
            writer.close()
            with contextlib.suppress(ConnectionError, OSError):
                await writer.wait_closed()

    async def _requests(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: _Connection
    ) -> None:
        while True:
            try:
                async with asyncio.timeout(IDLE_TIMEOUT_S):
                    request = await read_request(
                        reader, lambda: writer.write(CONTINUE), self._max_body
                    )
            except TimeoutError:
                return
            except HttpError as err:
                error = OpenAIError(err.status, err.message)
                await ResponseWriter(writer, keep_alive=False).send_json(err.status, error.body())
                return
            if request is None:
                return
            state.busy = True
            await self._app.handle(request, ResponseWriter(writer, request.keep_alive))
            state.busy = False
            if not request.keep_alive:
                return

    async def close(self, grace_s: float = 5.0) -> None:
        """Stop accepting, let requests in flight finish within `grace_s`, then cancel them."""
        if self._server is not None:
            self._server.close()
        for task, state in list(self._connections.items()):
            if not state.busy:
                task.cancel()
        pending = list(self._connections)
        if pending:
            _, late = await asyncio.wait(pending, timeout=grace_s)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
        if self._channel is not None:
            await self._channel.close()


async def start_openai_http(
    host: str,
    port: int,
    llm: InProcessLLMService | str,
    *,
    region_header: str = "x-llm-region",
    max_body_bytes: int = MAX_BODY_BYTES,
    tls: ServerTls | None = None,
) -> OpenAIHttp:
    """Serve the OpenAI-compatible API on host:port (0 = a free port), translating every call
    onto LLMService: in this process (the router's own servicer), or at a gRPC target (a
    translator hosted apart from its router)."""
    channel = None
    if isinstance(llm, str):
        # No gRPC-level retries: the edge already retries this hop.
        channel = make_channel(llm, retry_unavailable=False, tls=tls)
        app = OpenAIApp(pb_grpc.LLMServiceStub(channel), region_header)
    else:
        app = OpenAIApp(llm, region_header)
    listener = OpenAIHttp(app, channel, max_body_bytes)
    await listener._start(host, port, None if tls is None else tls.http_context())
    _log.info("openai http listening", port=listener.port)
    return listener
