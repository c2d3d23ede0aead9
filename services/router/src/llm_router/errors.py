"""Downstream failures as domain errors: what the router's callers see, and what it retries."""

from __future__ import annotations

import grpc

from llm_common.errors import (
    DeadlineExceeded,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
    ServiceError,
    Unauthenticated,
    Unavailable,
    parse_error,
)

# Codes that describe the caller's request: passed on as they are, never retried.
_CLIENT_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.ALREADY_EXISTS,
    }
)


class DependencyUnavailable(Unavailable):
    """A service the router needs did not answer (down, overloaded or failing)."""

    def __init__(self, service: str, retry_after_s: float | None = 1.0) -> None:
        super().__init__(f"{service} is unavailable", retry_after_s=retry_after_s)
        self.service = service


class ReplicaFailed(Exception):  # noqa: N818 - an event, like StopIteration
    """An inference replica failed a request in a way another replica may not: retry there.

    `exclude` is False for back-pressure (the replica is busy, not broken).
    """

    def __init__(self, replica: str, code: grpc.StatusCode, *, exclude: bool = True) -> None:
        super().__init__(f"replica {replica} failed: {code.name}")
        self.replica = replica
        self.code = code
        self.exclude = exclude


def is_client_error(err: grpc.RpcError) -> bool:
    """Whether the status blames the request rather than the service."""
    return err.code() in _CLIENT_CODES


def from_rpc_error(err: grpc.RpcError, service: str) -> ServiceError:
    """The domain error for a failed downstream call, keeping field/quota details.

    Client errors keep their code and details (the downstream validated on our caller's
    behalf); everything else becomes UNAVAILABLE naming the dependency, never INTERNAL with
    a leaked downstream message.
    """
    details = parse_error(err)
    code = details.code
    if code == grpc.StatusCode.INVALID_ARGUMENT or code == grpc.StatusCode.OUT_OF_RANGE:
        return InvalidArgument(details.field_violations, details.message or "invalid request")
    if code == grpc.StatusCode.NOT_FOUND:
        resource_type, name = details.resource or ("resource", "")
        return NotFound(resource_type, name, details.message or None)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return QuotaExceeded(
            details.quota_violations, details.retry_after_s, details.message or "quota exceeded"
        )
    if code == grpc.StatusCode.PERMISSION_DENIED:
        reason = details.error_info.reason if details.error_info else "PERMISSION_DENIED"
        return PermissionDenied(details.message or "permission denied", reason=reason)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return Unauthenticated(details.message or "authentication required")
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return FailedPrecondition(details.message or "failed precondition")
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return DeadlineExceeded(f"{service} did not answer within the deadline")
    return DependencyUnavailable(service, details.retry_after_s or 1.0)
