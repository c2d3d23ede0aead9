"""Threat 9 (docs/security.md), auth's part: ForgetTenant deletes a tenant's keys (they stop
authenticating at once) and rate-limit state, nothing of another tenant's; only an admin of
the admin tenant may, never on the admin tenant; audited (real auth server, real Redis)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio
import redis.asyncio

from llm_auth.apikeys import generate_key
from llm_auth.keyspace import Keyspace
from llm_auth.testing import AuthHarness, make_settings, serving
from llm_common.errors import parse_error
from llmapi.auth.v1 import auth_service_pb2 as pb
from llmapi.auth.v1 import auth_service_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.integration, pytest.mark.security]

BOOTSTRAP = generate_key().text
ROOT = [("x-api-key", BOOTSTRAP)]


@pytest_asyncio.fixture
async def auth(redis_url: str, prefix: str) -> AsyncIterator[AuthHarness]:
    settings = make_settings(redis_url, prefix, bootstrap_admin_key=BOOTSTRAP)
    async with serving(settings) as harness:
        await asyncio.wait_for(harness.app.wait_bootstrapped(), 10)
        yield harness


async def authenticates(stub: pb_grpc.AuthServiceAsyncStub, secret: str) -> bool:
    try:
        await stub.Authenticate(pb.AuthenticateRequest(credential=secret))
    except grpc.aio.AioRpcError as err:
        if err.code() != grpc.StatusCode.UNAUTHENTICATED:
            raise
        return False
    return True


async def test_forget_deletes_one_tenants_keys_and_limits(
    auth: AuthHarness, redis_url: str, prefix: str
) -> None:
    stub = pb_grpc.AuthServiceStub(auth.channel)
    gone = [await auth.create_key("t-gone") for _ in range(2)]
    (_, kept) = await auth.create_key("t-kept")
    space = Keyspace(prefix)
    client = redis.asyncio.Redis.from_url(redis_url)
    try:
        for tenant in ("t-gone", "t-kept"):  # rate-limit state of both
            await client.set(space.bucket(tenant, "tok:tenant"), "1")
        for _, key in gone:
            assert await authenticates(stub, key.text)  # now cached in the authenticator

        reply = await stub.ForgetTenant(pb.ForgetTenantRequest(tenant_id="t-gone"), metadata=ROOT)
        assert reply.keys_deleted == 2

        for _, key in gone:
            assert not await authenticates(stub, key.text)
        assert await authenticates(stub, kept.text)
        assert await client.keys(f"{prefix}*t-gone*") == []
        assert await client.exists(space.bucket("t-kept", "tok:tenant"))
        listed = await stub.ListKeys(pb.ListKeysRequest(tenant_id="t-kept"), metadata=ROOT)
        assert len(listed.keys) == 1
    finally:
        await client.aclose()


async def test_forget_is_for_the_admin_tenant_only(auth: AuthHarness) -> None:
    stub = pb_grpc.AuthServiceStub(auth.channel)
    record, own_admin = await auth.create_key("t-other", scopes=("admin",))
    cases = [
        (ROOT, "", grpc.StatusCode.INVALID_ARGUMENT),
        (ROOT, "system", grpc.StatusCode.PERMISSION_DENIED),  # the admin tenant itself
        ([("x-api-key", own_admin.text)], "t-other", grpc.StatusCode.PERMISSION_DENIED),
        ([("x-api-key", "sk-nope")], "t-other", grpc.StatusCode.UNAUTHENTICATED),
    ]
    for metadata, tenant, code in cases:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.ForgetTenant(pb.ForgetTenantRequest(tenant_id=tenant), metadata=metadata)
        assert refused.value.code() == code, tenant
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            fields = {v.field for v in parse_error(refused.value).field_violations}
            assert fields == {"tenant_id"}
    assert await authenticates(stub, own_admin.text)
    assert record.tenant_id == "t-other"
