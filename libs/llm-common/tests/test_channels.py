"""make_channel: retry policy on UNAVAILABLE, options, and remaining_timeout."""

from __future__ import annotations

import json
import time

import grpc
import pytest

from llm_common.channels import channel_options, make_channel, remaining_timeout
from llm_common.deadlines import deadline_var
from llm_common.errors import Unavailable
from llm_testing import bytes_service, bytes_unary, running_server

SERVICE = "test.v1.Flaky"


async def test_unavailable_is_retried_only_when_enabled() -> None:
    attempts = 0

    async def flaky(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        nonlocal attempts
        attempts += 1
        if attempts % 3:  # fails twice, then succeeds
            raise Unavailable("warming up")
        return b"ok"

    async with running_server(bytes_service(SERVICE, unary={"Call": flaky})) as server:
        retrying = make_channel(server.target)
        plain = make_channel(server.target, retry_unavailable=False)
        try:
            assert await bytes_unary(retrying, f"/{SERVICE}/Call")(b"", timeout=5) == b"ok"
            assert attempts == 3
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await bytes_unary(plain, f"/{SERVICE}/Call")(b"", timeout=5)
            assert info.value.code() is grpc.StatusCode.UNAVAILABLE
            assert attempts == 4
        finally:
            await retrying.close()
            await plain.close()


def test_channel_options() -> None:
    options = dict(channel_options(max_message_bytes=1024))
    assert options["grpc.keepalive_time_ms"] == 30_000
    assert options["grpc.keepalive_timeout_ms"] == 10_000
    assert options["grpc.max_receive_message_length"] == 1024
    policy = json.loads(options["grpc.service_config"])["methodConfig"][0]["retryPolicy"]
    assert policy["retryableStatusCodes"] == ["UNAVAILABLE"]
    assert (policy["maxAttempts"], policy["initialBackoff"], policy["maxBackoff"]) == (
        3,
        "0.1s",
        "1s",
    )
    no_retry = dict(channel_options(retry_unavailable=False))
    assert "retryPolicy" not in no_retry["grpc.service_config"]


def test_remaining_timeout() -> None:
    assert remaining_timeout(5.0) == 5.0
    assert remaining_timeout(None) is None
    token = deadline_var.set(time.monotonic() + 1.0)
    try:
        assert 0.9 < remaining_timeout(5.0) <= 1.0
        assert remaining_timeout(0.2) == 0.2
        assert 0.9 < remaining_timeout(None) <= 1.0  # type: ignore[operator]
    finally:
        deadline_var.reset(token)
    token = deadline_var.set(time.monotonic() - 1.0)
    try:
        assert remaining_timeout(5.0) == 0.0
    finally:
        deadline_var.reset(token)
