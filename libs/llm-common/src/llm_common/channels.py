"""Client channel factory: keepalive, limits, retries, request id, deadline and tracing."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import grpc
from opentelemetry import trace

from llm_common.config import MIB
from llm_common.deadlines import remaining_timeout
from llm_common.interceptors import REQUEST_ID_HEADER
from llm_common.logging import request_id_var
from llm_common.tracing import client_tracing_interceptors

__all__ = ["ContextPropagationInterceptor", "channel_options", "make_channel", "remaining_timeout"]

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


def _propagated(details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
    metadata = grpc.aio.Metadata(*tuple(details.metadata or ()))
    request_id = request_id_var.get()
    if request_id is not None and metadata.get(REQUEST_ID_HEADER) is None:
        metadata.add(REQUEST_ID_HEADER, request_id)
    timeout = remaining_timeout(details.timeout)
    if timeout is not None:
        timeout = max(timeout, MIN_TIMEOUT_S)
    return grpc.aio.ClientCallDetails(
        details.method, timeout, metadata, details.credentials, details.wait_for_ready
    )


class ContextPropagationInterceptor(
    grpc.aio.UnaryUnaryClientInterceptor,
    grpc.aio.UnaryStreamClientInterceptor,
    grpc.aio.StreamUnaryClientInterceptor,
    grpc.aio.StreamStreamClientInterceptor,
):
    """Adds `x-request-id` from the current RPC and caps the timeout by its remaining deadline."""

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_propagated(details), request)

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_propagated(details), request)

    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_propagated(details), requests)

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_propagated(details), requests)


def make_channel(
    target: str,
    *,
    max_message_bytes: int = 16 * MIB,
    retry_unavailable: bool = True,
    extra_interceptors: Sequence[grpc.aio.ClientInterceptor] = (),
    tracer_provider: trace.TracerProvider | None = None,
) -> grpc.aio.Channel:
    """An insecure grpc.aio channel to `target` (mTLS is the mesh sidecar's job).

    Set `retry_unavailable=False` when the call goes through an Envoy hop that already
    retries, so the same hop is never retried at two layers.
    """
    interceptors: list[grpc.aio.ClientInterceptor] = [
        ContextPropagationInterceptor(),
        *client_tracing_interceptors(tracer_provider),
        *extra_interceptors,
    ]
    options = channel_options(
        max_message_bytes=max_message_bytes, retry_unavailable=retry_unavailable
    )
    return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
