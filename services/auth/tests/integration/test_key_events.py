"""Replicas cache verified keys; a revocation or rotation on one reaches the others at once."""

from __future__ import annotations

import asyncio
import time

import grpc
import pytest

from llm_auth.testing import make_settings, serving
from llmapi.auth.v1 import auth_service_pb2 as pb
from llmapi.auth.v1 import auth_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration
FRESH_S = 30.0  # far longer than the test: only the announcement can explain an eviction


async def rejected_within(stub: pb_grpc.AuthServiceStub, secret: str, seconds: float) -> float:
    """Seconds until `secret` is refused as UNAUTHENTICATED on `stub`'s replica."""
    start = time.monotonic()
    code = None
    while code is None and time.monotonic() - start < seconds:
        try:
            await stub.Authenticate(pb.AuthenticateRequest(credential=secret))
            await asyncio.sleep(0.01)
        except grpc.aio.AioRpcError as err:
            code = err.code()
    assert code == grpc.StatusCode.UNAUTHENTICATED, f"still accepted after {seconds} s"
    return time.monotonic() - start


async def test_revocation_and_rotation_reach_other_replicas(
    redis_url: str, prefix: str, unique_tenant: str
) -> None:
    settings = make_settings(redis_url, prefix, key_fresh_s=FRESH_S)
    async with serving(settings) as first, serving(settings) as second:
        for replica in (first, second):
            await asyncio.wait_for(replica.app.key_events.subscribed.wait(), 10)
        on_second = pb_grpc.AuthServiceStub(second.channel)
        revoked, revoked_key = await first.create_key(unique_tenant)
        rotated, rotated_key = await first.create_key(unique_tenant)
        for key in (revoked_key, rotated_key):
            await on_second.Authenticate(pb.AuthenticateRequest(credential=key.text))

        await first.app.keys.revoke(revoked.key_id, now_ms=1)
        assert await rejected_within(on_second, revoked_key.text, 2.0) < 2.0

        rotation = await first.app.keys.rotate(rotated.key_id, grace_ms=0, now_ms=1)
        assert rotation is not None
        _, new_key = rotation
        await on_second.Authenticate(pb.AuthenticateRequest(credential=new_key.text))
        assert await rejected_within(on_second, rotated_key.text, 2.0) < 2.0
