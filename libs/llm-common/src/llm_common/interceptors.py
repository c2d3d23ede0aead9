"""The grpc.aio server interceptor: span, request id, deadline, access log + metrics, errors.

One interceptor does all four jobs with one wrapper per method, reused while the method's handler
stays the same: stacking an interceptor per job re-wrapped every handler on every call.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from grpc_health.v1 import health
from grpc_reflection.v1alpha import reflection
from opentelemetry import trace

from llm_common.context_tokens import restore
from llm_common.deadlines import deadline_var, work_deadline
from llm_common.errors import FieldViolation, InvalidArgument, ServiceError
from llm_common.logging import get_logger, request_id_var
from llm_common.metrics import RpcMetrics, default_rpc_metrics, split_method
from llm_common.tracing import ServerSpan, rpc_tracer

REQUEST_ID_HEADER = "x-request-id"
INTERNAL_MESSAGE = "internal error"
_REQUEST_ID_PATTERN = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Server-side faults are logged at WARNING; everything else is the client's doing.
_SERVER_FAULTS = frozenset({"UNKNOWN", "INTERNAL", "DATA_LOSS", "UNIMPLEMENTED"})
# Probes and reflection would drown the access log; they are still counted in metrics.
QUIET_SERVICES = frozenset({health.SERVICE_NAME, reflection.SERVICE_NAME})

Context = grpc.aio.ServicerContext[Any, Any]
_log = get_logger(__name__)
_stdlib_log = logging.getLogger(__name__)


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


@dataclass(frozen=True, slots=True)
class _Method:
    """What the per-call bookkeeping needs to know about one method, computed once."""

    full_name: str
    service: str
    name: str
    quiet: bool
    logged: bool  # the service logs its successful calls itself: their line is DEBUG
    metrics: RpcMetrics
    tracer: trace.Tracer | None  # None: no span (probes, reflection)


class _Call:
    """Bookkeeping of one RPC: context variables in, metrics and the access log line out."""

    __slots__ = ("_deadline_token", "_ended", "_id_token", "_method", "_peer", "_span", "_start")

    def __init__(self, method: _Method, context: Context) -> None:
        self._method = method
        # Read now: grpc crashes the process when peer() is called on a cancelled stream.
        self._peer = "" if method.quiet else context.peer()
        metadata = context.invocation_metadata()
        self._span = (
            None
            if method.tracer is None
            else ServerSpan.start(method.tracer, method.full_name, metadata)
        )
        self._id_token = request_id_var.set(request_id_from(metadata))
        self._deadline_token = deadline_var.set(work_deadline(context.time_remaining()))
        method.metrics.started(method.service, method.name)
        self._start = time.perf_counter()
        self._ended = False

    async def fail(self, context: Context, error: Exception) -> None:
        """Turn a handler's exception into its status; the client never sees internals.

        The call is recorded (span, metrics, log) before the status is sent: once the caller
        has it, it may look for them at once.
        """
        if isinstance(error, grpc.aio.AbortError):  # the handler already chose its status
            raise error
        if isinstance(error, ServiceError):
            status = error.to_status()
            self._record(status.code)
            await context.abort_with_status(status)
        _log.exception("unhandled error in RPC handler", method=self._method.full_name)
        self._record(grpc.StatusCode.INTERNAL)
        await context.abort(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)

    def end(self, context: Context, error: BaseException | None) -> None:
        if not self._ended:
            code = _final_code(context, error)
            if code is grpc.StatusCode.OK:
                self._record_soon(code)
            else:
                self._record(code)
        restore(self._deadline_token, self._id_token)

    def _record(self, code: grpc.StatusCode) -> None:
        self._ended = True
        if self._span is not None:
            self._span.detach()
        self._write(code, time.perf_counter())

    def _record_soon(self, code: grpc.StatusCode) -> None:
        """Record a success just after its response leaves, not before: the caller does not
        wait for the server's bookkeeping. The callback is queued before the response is
        written, so it has run before any later reply of this process reaches anyone."""
        self._ended = True
        if self._span is not None:
            self._span.detach()  # now: the context to restore is this call's
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # finalized outside the loop: nothing to wait for
            self._write(code, time.perf_counter())
            return
        loop.call_soon(self._write, code, time.perf_counter())

    def _write(self, code: grpc.StatusCode, ended: float) -> None:
        method = self._method
        duration = ended - self._start
        method.metrics.finished(method.service, method.name, code.name, duration)
        _access_log(method, code.name, duration, self._peer)
        if self._span is not None:
            self._span.finish(code)


def _final_code(context: Context, error: BaseException | None) -> grpc.StatusCode:
    if isinstance(error, asyncio.CancelledError | GeneratorExit):
        return grpc.StatusCode.CANCELLED
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    return grpc.StatusCode.UNKNOWN if error is not None else grpc.StatusCode.OK


def _access_log(method: _Method, code: str, duration: float, peer: str) -> None:
    if method.quiet or (method.logged and code == "OK"):
        level = logging.DEBUG
    else:
        level = logging.WARNING if code in _SERVER_FAULTS else logging.INFO
    # Ask the stdlib logger first (it caches the answer): a structlog call builds a bound
    # logger even for a line it then drops, and quiet methods log at DEBUG, usually off.
    if not _stdlib_log.isEnabledFor(level):
        return
    fields = {"method": method.full_name, "code": code, "duration_ms": round(duration * 1e3, 3)}
    if not method.quiet:
        fields["peer"] = peer
    _log.log(level, "rpc", **fields)


@dataclass(frozen=True, slots=True)
class Undecodable:
    """Stands in for a request whose bytes did not parse, so the handler can answer
    INVALID_ARGUMENT (grpc itself would answer UNKNOWN and log an error)."""

    error: str


def decoding_guarded(deserialize: Callable[[bytes], Any] | None) -> Any:
    """`deserialize` returning Undecodable instead of raising on malformed bytes."""
    if deserialize is None:
        return None

    def parse(data: bytes) -> Any:
        try:
            return deserialize(data)
        except (DecodeError, UnicodeDecodeError) as exc:
            return Undecodable(type(exc).__name__)

    return parse


def refuse_undecodable(request: Any) -> None:
    """InvalidArgument for a request that did not parse."""
    if isinstance(request, Undecodable):
        raise InvalidArgument(
            [FieldViolation("", f"the request is not a valid message ({request.error})")]
        )


def _wrap_coroutine(behavior: Any, method: _Method) -> Any:
    async def call(request: Any, context: Context) -> Any:
        rpc = _Call(method, context)
        error: BaseException | None = None
        try:
            refuse_undecodable(request)
            return await behavior(request, context)
        except Exception as exc:
            error = exc
            await rpc.fail(context, exc)
        except BaseException as exc:  # cancellation: recorded, not mapped
            error = exc
            raise
        finally:
            rpc.end(context, error)

    return call


def _wrap_async_gen(behavior: Any, method: _Method) -> Any:
    async def stream(request: Any, context: Context) -> AsyncIterator[Any]:
        rpc = _Call(method, context)
        error: BaseException | None = None
        try:
            refuse_undecodable(request)
            async with aclosing(behavior(request, context)) as responses:
                async for response in responses:
                    yield response
        except Exception as exc:
            error = exc
            await rpc.fail(context, exc)
        except BaseException as exc:
            error = exc
            raise
        finally:
            rpc.end(context, error)

    return stream


def _wrap(behavior: Any, method: _Method) -> Any:
    if inspect.isasyncgenfunction(behavior):
        return _wrap_async_gen(behavior, method)
    return _wrap_coroutine(behavior, method)  # unary, or a stream using context.write()


def _is_async(handler: grpc.RpcMethodHandler[Any, Any]) -> bool:
    behavior = next(
        (getattr(handler, kind) for kind, _ in _FACTORIES if getattr(handler, kind)), None
    )
    return inspect.isasyncgenfunction(behavior) or inspect.iscoroutinefunction(behavior)


_FACTORIES = (
    ("unary_unary", grpc.unary_unary_rpc_method_handler),
    ("unary_stream", grpc.unary_stream_rpc_method_handler),
    ("stream_unary", grpc.stream_unary_rpc_method_handler),
    ("stream_stream", grpc.stream_stream_rpc_method_handler),
)


def wrap_handler(
    handler: grpc.RpcMethodHandler[Any, Any],
    wrap: Callable[[Any], Any],
    *,
    guard_decoding: bool = False,
) -> grpc.RpcMethodHandler[Any, Any]:
    """A copy of `handler` with its behaviour replaced by `wrap(behaviour)`, keeping its
    response serializer and request deserializer (made to return Undecodable instead of
    raising with `guard_decoding`; the wrapper must then refuse it)."""
    for kind, factory in _FACTORIES:
        behavior = getattr(handler, kind)
        if behavior is not None:
            deserialize = handler.request_deserializer
            if guard_decoding and kind.startswith("unary_"):  # not per item of a stream
                deserialize = decoding_guarded(deserialize)
            return factory(wrap(behavior), deserialize, handler.response_serializer)
    return handler


class CallInterceptor(grpc.aio.ServerInterceptor):
    """A server span continuing the caller's trace (not for health probes or reflection),
    request id and deadline context variables, `llm_rpc_*` metrics, one access log line per
    RPC (no payloads, no metadata), and errors mapped to rich statuses.

    ServiceError becomes its google.rpc status; anything unexpected becomes a generic INTERNAL
    whose cause is logged with its traceback, never sent to the client. `quiet_methods` (full
    names) log at DEBUG, for hot paths such as Envoy's ext_authz checks; `logged_methods` log
    their successful calls at DEBUG, for methods whose service writes a richer line of its own
    (failures, which it may not see, keep theirs).
    """

    def __init__(
        self,
        metrics: RpcMetrics | None = None,
        quiet_methods: Iterable[str] = (),
        tracer_provider: trace.TracerProvider | None = None,
        logged_methods: Iterable[str] = (),
    ) -> None:
        self._metrics = metrics
        self._tracer_provider = tracer_provider
        self._quiet = frozenset(quiet_methods)
        self._logged = frozenset(logged_methods)
        # method -> (handler seen, its wrapper); an inner interceptor that builds a handler per
        # call simply misses, so the cache never serves a stale or foreign handler.
        self._handlers: dict[str, tuple[Any, grpc.RpcMethodHandler[Any, Any]]] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        name = handler_call_details.method
        cached = self._handlers.get(name)
        if cached is not None and cached[0] is handler:
            return cached[1]
        method = self._describe(name)
        if not _is_async(handler):
            return handler  # sync handlers run on grpc's thread pool; left alone
        wrapped = wrap_handler(
            handler, lambda behavior: _wrap(behavior, method), guard_decoding=True
        )
        self._handlers[name] = (handler, wrapped)
        return wrapped

    def _describe(self, full_name: str) -> _Method:
        service, name = split_method(full_name)
        probe = service in QUIET_SERVICES
        quiet = probe or full_name in self._quiet
        metrics = self._metrics or default_rpc_metrics()
        tracer = None if probe else rpc_tracer(self._tracer_provider)
        logged = full_name in self._logged
        return _Method(full_name, service, name, quiet, logged, metrics, tracer)
