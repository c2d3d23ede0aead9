"""Client channel factory: keepalive, limits, retries, request id, deadline and tracing."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import grpc
from opentelemetry import trace

from llm_common.config import MIB
from llm_common.deadlines import remaining_timeout
from llm_common.interceptors import REQUEST_ID_HEADER
from llm_common.logging import request_id_var
from llm_common.server_tls import ServerTls
from llm_common.tracing import context_headers, end_client_span, rpc_tracer, start_client_span

__all__ = ["TracedChannel", "channel_options", "make_channel", "remaining_timeout"]

# A call whose incoming deadline already passed still goes out with a tiny timeout, so it
# fails fast with DEADLINE_EXCEEDED (gRPC treats a zero timeout as "no deadline").
MIN_TIMEOUT_S = 0.001

RETRY_POLICY = {
    "maxAttempts": 3,
    "initialBackoff": "0.1s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}


def _service_config(retry_unavailable: bool) -> str:
    method_config: dict[str, Any] = {"name": [{}]}
    if retry_unavailable:
        method_config["retryPolicy"] = RETRY_POLICY
    return json.dumps({"methodConfig": [method_config]})


def channel_options(
    *, max_message_bytes: int = 16 * MIB, retry_unavailable: bool = True
) -> list[tuple[str, Any]]:
    """Channel arguments: keepalive pings, message limits and the service config."""
    return [
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.enable_retries", 1 if retry_unavailable else 0),
        ("grpc.service_config", _service_config(retry_unavailable)),
    ]


def _status_now(call: grpc.aio.Call) -> grpc.StatusCode | None:
    # In a done callback the status is already there, so awaiting `code()` finishes without
    # suspending: drive it by hand instead of scheduling a task per call for one attribute.
    coroutine = call.code()
    try:
        coroutine.send(None)
    except StopIteration as finished:
        code: grpc.StatusCode = finished.value
        return code
    except Exception:  # a status we cannot read leaves the span without one
        return None
    coroutine.close()
    return None


class _Outgoing:
    """What every outgoing call carries: request id, capped timeout, trace context, a span."""

    __slots__ = ("_method", "_tracer")

    def __init__(self, method: str, tracer: trace.Tracer) -> None:
        self._method = method
        self._tracer = tracer

    def prepare(
        self, timeout: float | None, metadata: Any
    ) -> tuple[float | None, list[tuple[str, Any]], trace.Span]:
        entries = list(metadata or ())
        request_id = request_id_var.get()
        if request_id is not None and all(k != REQUEST_ID_HEADER for k, _ in entries):
            entries.append((REQUEST_ID_HEADER, request_id))
        span = start_client_span(self._tracer, self._method)
        entries.extend(context_headers(span))
        capped = remaining_timeout(timeout)
        if capped is not None:
            capped = max(capped, MIN_TIMEOUT_S)
        return capped, entries, span

    def start(self, inner: Callable[..., Any], first: Any, kwargs: dict[str, Any]) -> Any:
        timeout, metadata, span = self.prepare(
            kwargs.pop("timeout", None), kwargs.pop("metadata", None)
        )
        try:
            call = inner(first, timeout=timeout, metadata=metadata, **kwargs)
        except BaseException:
            end_client_span(span, None)
            raise
        if span.is_recording():  # else nothing to end: see tracing.unsampled_parent
            call.add_done_callback(lambda done: end_client_span(span, _status_now(done)))
        return call


# The options of a call, in the order the client-streaming stubs pass them positionally.
_CALL_OPTIONS = ("timeout", "metadata", "credentials", "wait_for_ready", "compression")


class _TracedCallable:
    """One of the channel's multi-callables (any of the four shapes), `_Outgoing` applied."""

    __slots__ = ("_inner", "_outgoing")

    def __init__(self, inner: Any, outgoing: _Outgoing) -> None:
        self._inner, self._outgoing = inner, outgoing

    def __call__(self, request: Any = None, *options: Any, **kwargs: Any) -> Any:
        kwargs.update(zip(_CALL_OPTIONS, options, strict=False))
        return self._outgoing.start(self._inner, request, kwargs)


class TracedChannel(grpc.aio.Channel):
    """A grpc.aio channel whose calls carry `x-request-id` from the current RPC, a timeout
    capped by its remaining deadline, and a client span whose context goes downstream.

    A wrapper rather than client interceptors: grpc.aio runs each intercepted call through
    an extra task, which doubled the client-side CPU of a loopback call.
    """

    def __init__(self, inner: grpc.aio.Channel, tracer: trace.Tracer) -> None:
        self._inner = inner
        self._tracer = tracer

    async def __aenter__(self) -> TracedChannel:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._inner.close()

    async def close(self, grace: float | None = None) -> None:
        await self._inner.close(grace)

    def get_state(self, try_to_connect: bool = False) -> grpc.ChannelConnectivity:
        return self._inner.get_state(try_to_connect)

    async def wait_for_state_change(self, last_observed_state: grpc.ChannelConnectivity) -> None:
        await self._inner.wait_for_state_change(last_observed_state)

    async def channel_ready(self) -> None:
        await self._inner.channel_ready()

    def unary_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._traced(self._inner.unary_unary(method, *args, **kwargs), method)

    def unary_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._traced(self._inner.unary_stream(method, *args, **kwargs), method)

    def stream_unary(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._traced(self._inner.stream_unary(method, *args, **kwargs), method)

    def stream_stream(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return self._traced(self._inner.stream_stream(method, *args, **kwargs), method)

    def _traced(self, inner: Any, method: str) -> _TracedCallable:
        return _TracedCallable(inner, _Outgoing(method, self._tracer))


def make_channel(
    target: str,
    *,
    max_message_bytes: int = 16 * MIB,
    retry_unavailable: bool = True,
    tracer_provider: trace.TracerProvider | None = None,
    tls: ServerTls | None = None,
) -> grpc.aio.Channel:
    """A grpc.aio channel to `target`, traced and carrying the request id and deadline of the
    RPC being served: plaintext (mTLS is the mesh sidecar's job), or with `tls` this
    process's mesh certificate (one host: llm_common.server_tls).

    Set `retry_unavailable=False` when the call goes through an Envoy hop that already
    retries, so the same hop is never retried at two layers.
    """
    options = channel_options(
        max_message_bytes=max_message_bytes, retry_unavailable=retry_unavailable
    )
    if tls is None:
        inner = grpc.aio.insecure_channel(target, options=options)
    else:
        inner = grpc.aio.secure_channel(target, tls.channel_credentials(), options=options)
    return TracedChannel(inner, rpc_tracer(tracer_provider))
