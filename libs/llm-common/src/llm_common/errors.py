"""Domain errors as gRPC statuses with google.rpc details, and their client-side parser."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import grpc
from google.protobuf import duration_pb2
from google.protobuf.message import Message
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

DEFAULT_DOMAIN = "llmapi"


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One invalid request field (`messages[0].content`) and why."""

    field: str
    description: str


@dataclass(frozen=True, slots=True)
class QuotaViolation:
    """One exhausted quota: the subject (`tenant:acme`) and which limit."""

    subject: str
    description: str


@dataclass(frozen=True, slots=True)
class PreconditionViolation:
    """One unmet precondition: type (`TOS`), subject and description."""

    type: str
    subject: str
    description: str


@dataclass(frozen=True, slots=True)
class ErrorInfoDetail:
    """google.rpc.ErrorInfo: a machine-readable reason within a domain."""

    reason: str
    domain: str
    metadata: Mapping[str, str] = field(default_factory=dict)


class ServiceError(Exception):
    """Base of the errors servers raise; ErrorInterceptor turns them into a rich gRPC status.

    The message goes to the client: never put secrets or user content in it.
    """

    code: ClassVar[grpc.StatusCode] = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, *, details: Sequence[Message] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.details: tuple[Message, ...] = tuple(details)

    def to_proto(self) -> Any:
        """The google.rpc.Status message with every detail packed into an Any."""
        status = status_pb2.Status(code=self.code.value[0], message=self.message)
        for detail in self.details:
            status.details.add().Pack(detail)
        return status

    def to_status(self) -> grpc.Status:
        """The grpc.Status for `context.abort_with_status`."""
        status: grpc.Status = rpc_status.to_status(self.to_proto())
        return status


def _retry_info(retry_after_s: float) -> Any:
    if not math.isfinite(retry_after_s) or retry_after_s < 0:
        raise ValueError("retry_after_s must be a finite number >= 0")
    delay = duration_pb2.Duration()
    delay.FromNanoseconds(round(retry_after_s * 1e9))
    return error_details_pb2.RetryInfo(retry_delay=delay)


def _error_info(reason: str, domain: str, metadata: Mapping[str, str] | None) -> Any:
    return error_details_pb2.ErrorInfo(reason=reason, domain=domain, metadata=dict(metadata or {}))


class InvalidArgument(ServiceError):
    """INVALID_ARGUMENT with a google.rpc.BadRequest listing every field violation."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(
        self, violations: Sequence[FieldViolation], message: str = "invalid request"
    ) -> None:
        bad_request = error_details_pb2.BadRequest()
        for violation in violations:
            bad_request.field_violations.add(
                field=violation.field, description=violation.description
            )
        super().__init__(message, details=[bad_request])
        self.violations = tuple(violations)


class NotFound(ServiceError):
    """NOT_FOUND with google.rpc.ResourceInfo naming the missing resource."""

    code = grpc.StatusCode.NOT_FOUND

    def __init__(self, resource_type: str, resource_name: str, message: str | None = None) -> None:
        info = error_details_pb2.ResourceInfo(
            resource_type=resource_type, resource_name=resource_name
        )
        super().__init__(message or f"{resource_type} {resource_name!r} not found", details=[info])
        self.resource_type = resource_type
        self.resource_name = resource_name


class AlreadyExists(ServiceError):
    """ALREADY_EXISTS with google.rpc.ResourceInfo naming the conflicting resource."""

    code = grpc.StatusCode.ALREADY_EXISTS

    def __init__(self, resource_type: str, resource_name: str, message: str | None = None) -> None:
        info = error_details_pb2.ResourceInfo(
            resource_type=resource_type, resource_name=resource_name
        )
        super().__init__(
            message or f"{resource_type} {resource_name!r} already exists", details=[info]
        )
        self.resource_type = resource_type
        self.resource_name = resource_name


class FailedPrecondition(ServiceError):
    """FAILED_PRECONDITION, with google.rpc.PreconditionFailure when violations are given."""

    code = grpc.StatusCode.FAILED_PRECONDITION

    def __init__(self, message: str, violations: Sequence[PreconditionViolation] = ()) -> None:
        details = []
        if violations:
            failure = error_details_pb2.PreconditionFailure()
            for v in violations:
                failure.violations.add(type=v.type, subject=v.subject, description=v.description)
            details.append(failure)
        super().__init__(message, details=details)


class Unauthenticated(ServiceError):
    """UNAUTHENTICATED with google.rpc.ErrorInfo (e.g. reason `API_KEY_INVALID`)."""

    code = grpc.StatusCode.UNAUTHENTICATED

    def __init__(
        self,
        message: str = "authentication required",
        *,
        reason: str = "UNAUTHENTICATED",
        domain: str = DEFAULT_DOMAIN,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message, details=[_error_info(reason, domain, metadata)])
        self.reason = reason


class PermissionDenied(ServiceError):
    """PERMISSION_DENIED with google.rpc.ErrorInfo (e.g. reason `SCOPE_MISSING`)."""

    code = grpc.StatusCode.PERMISSION_DENIED

    def __init__(
        self,
        message: str = "permission denied",
        *,
        reason: str = "PERMISSION_DENIED",
        domain: str = DEFAULT_DOMAIN,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message, details=[_error_info(reason, domain, metadata)])
        self.reason = reason


class QuotaExceeded(ServiceError):
    """RESOURCE_EXHAUSTED with google.rpc.QuotaFailure and, when known, RetryInfo."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(
        self,
        violations: Sequence[QuotaViolation],
        retry_after_s: float | None = None,
        message: str = "quota exceeded",
    ) -> None:
        failure = error_details_pb2.QuotaFailure()
        for v in violations:
            failure.violations.add(subject=v.subject, description=v.description)
        details = [failure]
        if retry_after_s is not None:
            details.append(_retry_info(retry_after_s))
        super().__init__(message, details=details)
        self.violations = tuple(violations)
        self.retry_after_s = retry_after_s


class Unavailable(ServiceError):
    """UNAVAILABLE (safe to retry), with RetryInfo when a delay is suggested."""

    code = grpc.StatusCode.UNAVAILABLE

    def __init__(
        self, message: str = "service unavailable", retry_after_s: float | None = None
    ) -> None:
        details = [] if retry_after_s is None else [_retry_info(retry_after_s)]
        super().__init__(message, details=details)
        self.retry_after_s = retry_after_s


class DeadlineExceeded(ServiceError):
    """DEADLINE_EXCEEDED: the work could not finish in the caller's time budget."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED

    def __init__(self, message: str = "deadline exceeded") -> None:
        super().__init__(message)


class Internal(ServiceError):
    """INTERNAL with a generic message; the cause belongs in the server log, not the client."""

    code = grpc.StatusCode.INTERNAL

    def __init__(self, message: str = "internal error") -> None:
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class ErrorDetails:
    """What a client learns from a failed call: code, message and the google.rpc details."""

    code: grpc.StatusCode
    message: str
    field_violations: tuple[FieldViolation, ...] = ()
    quota_violations: tuple[QuotaViolation, ...] = ()
    precondition_violations: tuple[PreconditionViolation, ...] = ()
    retry_after_s: float | None = None
    error_info: ErrorInfoDetail | None = None
    resource: tuple[str, str] | None = None  # (resource_type, resource_name)


def parse_error(err: grpc.RpcError) -> ErrorDetails:
    """Decode a caught `grpc.aio.AioRpcError` (or sync RpcError) including rich details."""
    code, message = err.code(), err.details() or ""
    try:
        # The sync from_call works on a caught AioRpcError; the aio variant needs the call.
        status = rpc_status.from_call(err)
    except ValueError:  # details disagree with the status line: trust the status line
        status = None
    if status is None:
        return ErrorDetails(code=code, message=message)
    return _collect(code, message, status.details)


def _collect(code: grpc.StatusCode, message: str, anys: Sequence[Any]) -> ErrorDetails:
    fields: dict[str, Any] = {}
    for any_msg in anys:
        fields.update(_unpack(any_msg))
    return ErrorDetails(code=code, message=message, **fields)


def _unpack(any_msg: Any) -> dict[str, Any]:
    for message_type, convert in _DETAIL_PARSERS:
        detail = message_type()
        if any_msg.Is(detail.DESCRIPTOR):
            any_msg.Unpack(detail)
            return convert(detail)
    return {}


def _bad_request(d: Any) -> dict[str, Any]:
    violations = tuple(FieldViolation(v.field, v.description) for v in d.field_violations)
    return {"field_violations": violations}


def _quota_failure(d: Any) -> dict[str, Any]:
    violations = tuple(QuotaViolation(v.subject, v.description) for v in d.violations)
    return {"quota_violations": violations}


def _precondition_failure(d: Any) -> dict[str, Any]:
    return {
        "precondition_violations": tuple(
            PreconditionViolation(v.type, v.subject, v.description) for v in d.violations
        )
    }


def _retry(d: Any) -> dict[str, Any]:
    return {"retry_after_s": d.retry_delay.ToNanoseconds() / 1e9}


def _info(d: Any) -> dict[str, Any]:
    return {"error_info": ErrorInfoDetail(d.reason, d.domain, dict(d.metadata))}


def _resource(d: Any) -> dict[str, Any]:
    return {"resource": (d.resource_type, d.resource_name)}


_DETAIL_PARSERS: tuple[tuple[Any, Callable[[Any], dict[str, Any]]], ...] = (
    (error_details_pb2.BadRequest, _bad_request),
    (error_details_pb2.QuotaFailure, _quota_failure),
    (error_details_pb2.PreconditionFailure, _precondition_failure),
    (error_details_pb2.RetryInfo, _retry),
    (error_details_pb2.ErrorInfo, _info),
    (error_details_pb2.ResourceInfo, _resource),
)
