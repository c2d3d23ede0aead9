"""Errors -> rich gRPC status through a real server -> ErrorDetails on the client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from llm_common.errors import (
    AlreadyExists,
    DeadlineExceeded,
    ErrorDetails,
    ErrorInfoDetail,
    FailedPrecondition,
    FieldViolation,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    PreconditionViolation,
    QuotaExceeded,
    QuotaViolation,
    ServiceError,
    Unauthenticated,
    Unavailable,
    parse_error,
)
from llm_common.interceptors import INTERNAL_MESSAGE
from llm_testing import (
    LogCapture,
    RunningServer,
    bytes_service,
    bytes_stream,
    bytes_unary,
    running_server,
)

SERVICE = "test.v1.Errors"
ERRORS: dict[bytes, ServiceError] = {
    b"invalid": InvalidArgument(
        [FieldViolation("model", "unknown model"), FieldViolation("max_tokens", "must be > 0")]
    ),
    b"quota": QuotaExceeded(
        [QuotaViolation("tenant:acme", "tokens per minute")], retry_after_s=1.5
    ),
    b"notfound": NotFound("model", "gpt-x"),
    b"exists": AlreadyExists("api_key", "k1"),
    b"precondition": FailedPrecondition(
        "budget closed", [PreconditionViolation("BUDGET", "tenant:acme", "closed")]
    ),
    b"unauthenticated": Unauthenticated(reason="API_KEY_INVALID"),
    b"denied": PermissionDenied(reason="SCOPE_MISSING", metadata={"scope": "admin"}),
    b"unavailable": Unavailable("billing down", retry_after_s=0.25),
    b"deadline": DeadlineExceeded(),
}


async def raise_named(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
    if request == b"ok":
        return b"ok"
    if request == b"abort":
        await context.abort(grpc.StatusCode.ABORTED, "handler aborted")
    if request in ERRORS:
        raise ERRORS[request]
    raise RuntimeError("db password=hunter2 leaked in a message")


async def stream_then_fail(
    request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]
) -> AsyncIterator[bytes]:
    yield b"first"
    if request == b"quota":
        raise ERRORS[b"quota"]
    raise KeyError("secret internals")


async def writer_stream(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> None:
    await context.write(b"first")
    raise ERRORS[b"invalid"]


@pytest.fixture
async def server() -> AsyncIterator[RunningServer]:
    spec = bytes_service(
        SERVICE,
        unary={"Raise": raise_named},
        server_streaming={"Stream": stream_then_fail, "Write": writer_stream},
    )
    async with running_server(spec) as running:
        yield running


async def _call(server: RunningServer, payload: bytes) -> ErrorDetails:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await bytes_unary(server.channel, f"/{SERVICE}/Raise")(payload, timeout=5)
    return parse_error(info.value)


async def test_bad_request_round_trip(server: RunningServer) -> None:
    details = await _call(server, b"invalid")
    assert details.code is grpc.StatusCode.INVALID_ARGUMENT
    assert details.message == "invalid request"
    assert details.field_violations == (
        FieldViolation("model", "unknown model"),
        FieldViolation("max_tokens", "must be > 0"),
    )


async def test_quota_failure_with_retry_info(server: RunningServer) -> None:
    details = await _call(server, b"quota")
    assert details.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details.quota_violations == (QuotaViolation("tenant:acme", "tokens per minute"),)
    assert details.retry_after_s == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("payload", "code", "check"),
    [
        (b"notfound", grpc.StatusCode.NOT_FOUND, lambda d: d.resource == ("model", "gpt-x")),
        (b"exists", grpc.StatusCode.ALREADY_EXISTS, lambda d: d.resource == ("api_key", "k1")),
        (
            b"precondition",
            grpc.StatusCode.FAILED_PRECONDITION,
            lambda d: d.precondition_violations[0].type == "BUDGET",
        ),
        (
            b"unauthenticated",
            grpc.StatusCode.UNAUTHENTICATED,
            lambda d: d.error_info == ErrorInfoDetail("API_KEY_INVALID", "llmapi", {}),
        ),
        (
            b"denied",
            grpc.StatusCode.PERMISSION_DENIED,
            lambda d: d.error_info.metadata == {"scope": "admin"},
        ),
        (b"unavailable", grpc.StatusCode.UNAVAILABLE, lambda d: d.retry_after_s == 0.25),
        (b"deadline", grpc.StatusCode.DEADLINE_EXCEEDED, lambda d: d.message),
        (b"abort", grpc.StatusCode.ABORTED, lambda d: d.message == "handler aborted"),
    ],
)
async def test_each_error_maps_to_its_code(
    server: RunningServer, payload: bytes, code: grpc.StatusCode, check: object
) -> None:
    details = await _call(server, payload)
    assert details.code is code
    assert check(details)  # type: ignore[operator]


async def test_unknown_exception_is_generic_internal_and_server_survives(
    server: RunningServer, json_logs: LogCapture
) -> None:
    details = await _call(server, b"surprise")
    assert details == ErrorDetails(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)
    (logged,) = json_logs.events("unhandled error in RPC handler")
    assert logged["level"] == "error"
    assert "RuntimeError" in logged["exception"]  # the cause stays server-side...
    assert "hunter2" not in json_logs.text  # ...with credentials scrubbed
    assert await bytes_unary(server.channel, f"/{SERVICE}/Raise")(b"ok", timeout=5) == b"ok"


async def _stream(
    server: RunningServer, method: str, payload: bytes
) -> tuple[list[bytes], ErrorDetails]:
    received: list[bytes] = []
    call = bytes_stream(server.channel, f"/{SERVICE}/{method}")(payload, timeout=5)
    try:
        async for message in call:
            received.append(message)
    except grpc.aio.AioRpcError as err:
        return received, parse_error(err)
    raise AssertionError("the stream did not fail")


async def test_streaming_service_error_keeps_details(server: RunningServer) -> None:
    received, details = await _stream(server, "Stream", b"quota")
    assert received == [b"first"]
    assert details.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert details.retry_after_s == pytest.approx(1.5)


async def test_streaming_unknown_error_is_internal(server: RunningServer) -> None:
    received, details = await _stream(server, "Stream", b"other")
    assert received == [b"first"]
    assert details == ErrorDetails(grpc.StatusCode.INTERNAL, INTERNAL_MESSAGE)


async def test_writer_style_stream_errors_are_mapped(server: RunningServer) -> None:
    received, details = await _stream(server, "Write", b"")
    assert received == [b"first"]
    assert details.code is grpc.StatusCode.INVALID_ARGUMENT
    assert len(details.field_violations) == 2


def test_to_status_packs_details() -> None:
    status = ERRORS[b"quota"].to_status()
    assert status.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert status.details == "quota exceeded"
    assert [key for key, _ in status.trailing_metadata] == ["grpc-status-details-bin"]


def test_retry_after_must_be_finite() -> None:
    with pytest.raises(ValueError, match="retry_after_s"):
        Unavailable(retry_after_s=float("inf"))
