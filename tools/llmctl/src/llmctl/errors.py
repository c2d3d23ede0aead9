"""A failed call as one line: status, message, and the google.rpc details that help."""

from __future__ import annotations

from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

_HINTS = {
    grpc.StatusCode.UNAUTHENTICATED: "check LLM_API_KEY",
    grpc.StatusCode.UNAVAILABLE: "is the platform up? (`make status`)",
}


def _details(err: grpc.RpcError) -> list[Any]:
    try:
        status = rpc_status.from_call(err)
    except ValueError:
        return []
    return [] if status is None else list(status.details)


def _describe_detail(any_msg: Any) -> str | None:
    for kind in (
        error_details_pb2.BadRequest,
        error_details_pb2.QuotaFailure,
        error_details_pb2.RetryInfo,
        error_details_pb2.PreconditionFailure,
    ):
        detail = kind()
        if any_msg.Is(detail.DESCRIPTOR):
            any_msg.Unpack(detail)
            return _render(detail)
    return None


def _render(detail: Any) -> str:
    if isinstance(detail, error_details_pb2.BadRequest):
        return "; ".join(f"{v.field}: {v.description}" for v in detail.field_violations)
    if isinstance(detail, error_details_pb2.QuotaFailure):
        return "; ".join(f"{v.subject}: {v.description}" for v in detail.violations)
    if isinstance(detail, error_details_pb2.RetryInfo):
        return f"retry in {detail.retry_delay.ToNanoseconds() / 1e9:.1f} s"
    return "; ".join(f"{v.type} {v.subject}: {v.description}" for v in detail.violations)


def one_line(err: grpc.RpcError) -> str:
    """e.g. `INVALID_ARGUMENT: invalid request (sampling.temperature: must be in [0, 2])`."""
    code: grpc.StatusCode = err.code()
    message = (err.details() or "").strip()
    message = " ".join(message.split())  # Envoy's local replies may span lines
    extras = [text for d in _details(err) if (text := _describe_detail(d))]
    if code in _HINTS:
        extras.append(_HINTS[code])
    suffix = f" ({'; '.join(extras)})" if extras else ""
    return f"{code.name}: {message}{suffix}"
