"""grpc.aio server interceptors: request id, deadline, access log + metrics, error mapping."""

from __future__ import annotations

import asyncio
import inspect
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager
from typing import Any

import grpc
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection

from llm_common.deadlines import deadline_after, deadline_var
from llm_common.errors import ServiceError
from llm_common.logging import get_logger, request_id_var
from llm_common.metrics import RpcMetrics, default_rpc_metrics, split_method

REQUEST_ID_HEADER = "x-request-id"
INTERNAL_MESSAGE = "internal error"
_REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Server-side faults are logged at WARNING; everything else is the client's doing.
_SERVER_FAULTS = frozenset({"UNKNOWN", "INTERNAL", "DATA_LOSS", "UNIMPLEMENTED"})
# Probes and reflection would drown the access log; they are still counted in metrics.
QUIET_SERVICES = frozenset({health.SERVICE_NAME, reflection.SERVICE_NAME})

Context = grpc.aio.ServicerContext[Any, Any]
Scope = Callable[[Context], AbstractAsyncContextManager[None]]
_log = get_logger(__name__)


def new_request_id() -> str:
    """A fresh request id (uuid4, hex)."""
    return uuid.uuid4().hex


def request_id_from(metadata: Iterable[tuple[str, Any]] | None) -> str:
    """The caller's `x-request-id` if well formed, else a fresh one.

    Ids are echoed in logs and responses, so anything long or odd is replaced, not trusted.
    """
    for key, value in metadata or ():
        if key == REQUEST_ID_HEADER and isinstance(value, str):
            if _REQUEST_ID_PATTERN.fullmatch(value):
                return value
            break
    return new_request_id()


def _wrap_coroutine(behavior: Any, scope: Scope) -> Any:
    async def call(request: Any, context: Context) -> Any:
        async with scope(context):
            return await behavior(request, context)

    return call


def _wrap_async_gen(behavior: Any, scope: Scope) -> Any:
    async def stream(request: Any, context: Context) -> AsyncIterator[Any]:
        async with scope(context), aclosing(behavior(request, context)) as responses:
            async for response in responses:
                yield response

    return stream


def _wrap(behavior: Any, scope: Scope) -> Any:
    if inspect.isasyncgenfunction(behavior):
        return _wrap_async_gen(behavior, scope)
    if inspect.iscoroutinefunction(behavior):  # unary, or a stream using context.write()
        return _wrap_coroutine(behavior, scope)
    return behavior  # sync handlers run on grpc's migration thread pool; left alone


_FACTORIES = (
    ("unary_unary", grpc.unary_unary_rpc_method_handler),
    ("unary_stream", grpc.unary_stream_rpc_method_handler),
    ("stream_unary", grpc.stream_unary_rpc_method_handler),
    ("stream_stream", grpc.stream_stream_rpc_method_handler),
)


def wrap_handler(
    handler: grpc.RpcMethodHandler[Any, Any], scope: Scope
) -> grpc.RpcMethodHandler[Any, Any]:
    """A copy of `handler` whose async behaviour runs inside `scope(context)`, keeping its
    request deserializer and response serializer."""
    for kind, factory in _FACTORIES:
        behavior = getattr(handler, kind)
        if behavior is not None:
            return factory(
                _wrap(behavior, scope),
                handler.request_deserializer,
                handler.response_serializer,
            )
    return handler


class ScopedInterceptor(grpc.aio.ServerInterceptor):
    """Base for interceptors that run each RPC's behaviour inside an async context manager."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None

        def scope(context: Context) -> AbstractAsyncContextManager[None]:
            return self.scope(handler_call_details, context)

        return wrap_handler(handler, scope)

    def scope(
        self, details: grpc.HandlerCallDetails, context: Context
    ) -> AbstractAsyncContextManager[None]:
        raise NotImplementedError


class RequestIdInterceptor(ScopedInterceptor):
    """Puts the caller's `x-request-id` (or a new one) in `request_id_var` for the RPC."""

    @asynccontextmanager
    async def scope(
        self, details: grpc.HandlerCallDetails, context: Context
    ) -> AsyncIterator[None]:
        token = request_id_var.set(request_id_from(details.invocation_metadata))
        try:
            yield
        finally:
            request_id_var.reset(token)


class DeadlineInterceptor(ScopedInterceptor):
    """Records the RPC's absolute deadline in `deadline_var` so outgoing calls can respect it."""

    @asynccontextmanager
    async def scope(
        self, details: grpc.HandlerCallDetails, context: Context
    ) -> AsyncIterator[None]:
        token = deadline_var.set(deadline_after(context.time_remaining()))
        try:
            yield
        finally:
            deadline_var.reset(token)


def _final_code(context: Context, error: BaseException | None) -> str:
    if isinstance(error, asyncio.CancelledError | GeneratorExit):
        return "CANCELLED"
    code = context.code()
    if code is not None:
        return str(code.name)
    return "UNKNOWN" if error is not None else "OK"


class AccessLogInterceptor(ScopedInterceptor):
    """One structured log line and the `llm_rpc_*` metrics per RPC (no payloads, no metadata)."""

    def __init__(self, metrics: RpcMetrics | None = None) -> None:
        self._metrics = metrics

    @asynccontextmanager
    async def scope(
        self, details: grpc.HandlerCallDetails, context: Context
    ) -> AsyncIterator[None]:
        metrics = self._metrics or default_rpc_metrics()
        service, method = split_method(details.method)
        metrics.started(service, method)
        start, error = time.perf_counter(), None
        try:
            yield
        except BaseException as exc:
            error = exc
            raise
        finally:
            duration = time.perf_counter() - start
            code = _final_code(context, error)
            metrics.finished(service, method, code, duration)
            self._log(details.method, service, code, duration, context)

    @staticmethod
    def _log(full_method: str, service: str, code: str, duration: float, context: Context) -> None:
        fields = {"method": full_method, "code": code, "duration_ms": round(duration * 1e3, 3)}
        if service in QUIET_SERVICES:
            _log.debug("rpc", **fields)
        elif code in _SERVER_FAULTS:
            _log.warning("rpc", peer=context.peer(), **fields)
        else:
            _log.info("rpc", peer=context.peer(), **fields)


class ErrorInterceptor(ScopedInterceptor):
    """Maps ServiceError to its rich status; anything unexpected becomes a generic INTERNAL.

    The exception text never reaches the client (it may hold internals or user data); it is
    logged with its traceback instead. Cancellation passes through untouched.
    """

    @asynccontextmanager
    async def scope(
        self, details: grpc.HandlerCallDetails, context: Context
    ) -> AsyncIterator[None]:
        try:
            yield
        except grpc.aio.AbortError:  # the handler already aborted with its own status
            raise
        except ServiceError as err:
            await context.abort_with_status(err.to_status())
        except Exception:
            _log.exception("unhandled error in RPC handler", method=details.method)
            await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)
