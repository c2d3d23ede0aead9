"""AuthService over a real grpc.aio server on port 0 and a real Redis."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest
import pytest_asyncio
from google.protobuf import duration_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llm_auth.apikeys import generate_key
from llm_auth.config import DefaultLimits
from llm_auth.principal import KeyLimits
from llm_auth.testing import AuthHarness, make_settings, serving
from llm_common.errors import ErrorDetails, parse_error
from llmapi.auth.v1 import auth_service_pb2 as pb
from llmapi.auth.v1 import auth_service_pb2_grpc as pb_grpc

pytestmark = pytest.mark.integration

BOOTSTRAP = generate_key().text
Metadata = list[tuple[str, str]]


@pytest_asyncio.fixture
async def auth(redis_url: str, prefix: str) -> AsyncIterator[AuthHarness]:
    settings = make_settings(redis_url, prefix, bootstrap_admin_key=BOOTSTRAP)
    async with serving(settings) as harness:
        await asyncio.wait_for(harness.app.wait_bootstrapped(), 10)
        yield harness


def stub(auth: AuthHarness) -> pb_grpc.AuthServiceStub:
    return pb_grpc.AuthServiceStub(auth.channel)


ROOT: Metadata = [("x-api-key", BOOTSTRAP)]


async def error_of(call: object) -> ErrorDetails:
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call  # type: ignore[misc]
    return parse_error(caught.value)


async def create(
    auth: AuthHarness, tenant: str, metadata: Metadata = ROOT, **fields: object
) -> pb.CreateKeyResponse:
    request = pb.CreateKeyRequest(tenant_id=tenant, name="k", **fields)  # type: ignore[arg-type]
    response: pb.CreateKeyResponse = await stub(auth).CreateKey(request, metadata=metadata)
    return response


async def test_bootstrap_admin_key_can_create_keys_that_authenticate(
    auth: AuthHarness, unique_tenant: str
) -> None:
    created = await create(
        auth,
        unique_tenant,
        scopes=["completion:write"],
        allowed_models=["demo-llama"],
        limits=pb.KeyLimits(requests_per_minute=60, tokens_per_minute=1000),
        labels={"team": "ml"},
    )
    assert created.secret.startswith(f"sk-{created.key.key_id}.")
    assert created.key.secret_hint.endswith("…")
    assert created.secret not in str(created.key)
    reply = await stub(auth).Authenticate(
        pb.AuthenticateRequest(
            credential=created.secret, required_scopes=["completion:write"], model="demo-llama"
        )
    )
    p = reply.principal
    assert (p.tenant_id, p.key_id, p.credential_type) == (
        unique_tenant,
        created.key.key_id,
        "api_key",
    )
    assert p.limits.requests_per_minute == 60
    admins = await stub(auth).ListKeys(pb.ListKeysRequest(tenant_id="system"), metadata=ROOT)
    assert [k.name for k in admins.keys] == ["bootstrap-admin"]
    assert BOOTSTRAP.startswith(f"sk-{admins.keys[0].key_id}.")
    stored = await auth.app.keys.get(created.key.key_id)
    assert stored is not None
    assert created.secret.split(".")[1] not in str(stored)  # only the digest is kept


async def test_admin_rpcs_need_an_admin_credential(auth: AuthHarness, unique_tenant: str) -> None:
    err = await error_of(stub(auth).CreateKey(pb.CreateKeyRequest(tenant_id=unique_tenant)))
    assert err.code == grpc.StatusCode.UNAUTHENTICATED
    user = await create(auth, unique_tenant, scopes=["completion:write"])
    err = await error_of(
        stub(auth).ListKeys(
            pb.ListKeysRequest(tenant_id=unique_tenant), metadata=[("x-api-key", user.secret)]
        )
    )
    assert err.code == grpc.StatusCode.PERMISSION_DENIED
    assert err.error_info is not None
    assert err.error_info.reason == "ADMIN_SCOPE_REQUIRED"


async def test_tenant_admins_only_reach_their_tenant(auth: AuthHarness, unique_tenant: str) -> None:
    tenant_admin = await create(auth, unique_tenant, scopes=["admin"])
    metadata = [("authorization", f"Bearer {tenant_admin.secret}")]
    own = await create(auth, unique_tenant, metadata)
    assert own.key.tenant_id == unique_tenant
    err = await error_of(
        stub(auth).CreateKey(pb.CreateKeyRequest(tenant_id="other-tenant"), metadata=metadata)
    )
    assert err.code == grpc.StatusCode.PERMISSION_DENIED
    foreign = await create(auth, "other-" + unique_tenant)
    err = await error_of(
        stub(auth).RevokeKey(pb.RevokeKeyRequest(key_id=foreign.key.key_id), metadata=metadata)
    )
    assert err.code == grpc.StatusCode.NOT_FOUND


async def test_list_pages_and_hides_revoked_keys(auth: AuthHarness, unique_tenant: str) -> None:
    keys = [await create(auth, unique_tenant) for _ in range(5)]
    await stub(auth).RevokeKey(pb.RevokeKeyRequest(key_id=keys[1].key.key_id), metadata=ROOT)
    seen: list[str] = []
    token = ""
    while True:
        page = await stub(auth).ListKeys(
            pb.ListKeysRequest(tenant_id=unique_tenant, page_size=2, page_token=token),
            metadata=ROOT,
        )
        seen += [k.key_id for k in page.keys]
        token = page.next_page_token
        if not token:
            break
    assert seen == [k.key.key_id for i, k in enumerate(keys) if i != 1]
    everything = await stub(auth).ListKeys(
        pb.ListKeysRequest(tenant_id=unique_tenant, include_revoked=True), metadata=ROOT
    )
    assert len(everything.keys) == 5
    assert everything.keys[1].HasField("revoked_at")


async def test_revoked_keys_stop_working_at_once(auth: AuthHarness, unique_tenant: str) -> None:
    key = await create(auth, unique_tenant)
    await stub(auth).Authenticate(pb.AuthenticateRequest(credential=key.secret))
    revoked = await stub(auth).RevokeKey(pb.RevokeKeyRequest(key_id=key.key.key_id), metadata=ROOT)
    assert revoked.key.HasField("revoked_at")
    err = await error_of(stub(auth).Authenticate(pb.AuthenticateRequest(credential=key.secret)))
    assert err.code == grpc.StatusCode.UNAUTHENTICATED
    assert err.error_info is not None
    assert err.error_info.reason == "API_KEY_REVOKED"


async def test_rotation_keeps_the_old_secret_for_the_grace_period(
    auth: AuthHarness, unique_tenant: str
) -> None:
    key = await create(auth, unique_tenant)
    rotated = await stub(auth).RotateKey(
        pb.RotateKeyRequest(key_id=key.key.key_id, grace_period=duration_pb2.Duration(seconds=60)),
        metadata=ROOT,
    )
    assert rotated.secret != key.secret
    assert rotated.key.key_id == key.key.key_id
    for secret in (key.secret, rotated.secret):
        await stub(auth).Authenticate(pb.AuthenticateRequest(credential=secret))
    again = await stub(auth).RotateKey(
        pb.RotateKeyRequest(key_id=key.key.key_id, grace_period=duration_pb2.Duration()),
        metadata=ROOT,
    )
    for stale in (key.secret, rotated.secret):
        err = await error_of(stub(auth).Authenticate(pb.AuthenticateRequest(credential=stale)))
        assert err.error_info is not None
        assert err.error_info.reason == "API_KEY_INVALID"
    await stub(auth).Authenticate(pb.AuthenticateRequest(credential=again.secret))


async def test_rotating_a_revoked_key_fails_precondition(
    auth: AuthHarness, unique_tenant: str
) -> None:
    key = await create(auth, unique_tenant)
    await stub(auth).RevokeKey(pb.RevokeKeyRequest(key_id=key.key.key_id), metadata=ROOT)
    err = await error_of(
        stub(auth).RotateKey(pb.RotateKeyRequest(key_id=key.key.key_id), metadata=ROOT)
    )
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION


async def test_expired_keys_are_unauthenticated(auth: AuthHarness, unique_tenant: str) -> None:
    key = await create(auth, unique_tenant, ttl=duration_pb2.Duration(nanos=1_000_000))
    assert key.key.HasField("expires_at")
    err = await error_of(stub(auth).Authenticate(pb.AuthenticateRequest(credential=key.secret)))
    assert err.error_info is not None
    assert err.error_info.reason == "API_KEY_EXPIRED"


async def test_scope_and_model_checks(auth: AuthHarness, unique_tenant: str) -> None:
    key = await create(auth, unique_tenant, scopes=["embedding:read"], allowed_models=["m1"])
    ask = stub(auth).Authenticate
    err = await error_of(ask(pb.AuthenticateRequest(credential=key.secret, model="m2")))
    assert err.code == grpc.StatusCode.PERMISSION_DENIED
    assert err.error_info is not None
    assert err.error_info.reason == "MODEL_NOT_ALLOWED"
    err = await error_of(
        ask(pb.AuthenticateRequest(credential=key.secret, required_scopes=["completion:write"]))
    )
    assert err.error_info is not None
    assert err.error_info.reason == "SCOPE_MISSING"


async def test_invalid_requests_list_every_field(auth: AuthHarness) -> None:
    request = pb.CreateKeyRequest(
        tenant_id="{bad}",
        name="n" * 200,
        scopes=["ok", "not ok"],
        limits=pb.KeyLimits(requests_per_minute=-1),
        labels={"Bad Key": "v"},
        ttl=duration_pb2.Duration(seconds=-5),
    )
    err = await error_of(stub(auth).CreateKey(request, metadata=ROOT))
    assert err.code == grpc.StatusCode.INVALID_ARGUMENT
    fields = {v.field for v in err.field_violations}
    assert fields == {
        "tenant_id",
        "name",
        "scopes[1]",
        "limits.requests_per_minute",
        "labels['Bad Key']",
        "ttl",
    }
    err = await error_of(
        stub(auth).ListKeys(
            pb.ListKeysRequest(tenant_id="t", page_size=5000, page_token="forged"), metadata=ROOT
        )
    )
    assert {v.field for v in err.field_violations} == {"page_size", "page_token"}
    err = await error_of(stub(auth).Authenticate(pb.AuthenticateRequest()))
    assert [v.field for v in err.field_violations] == ["credential"]
    health = health_pb2_grpc.HealthStub(auth.channel)
    status = await health.Check(health_pb2.HealthCheckRequest())
    assert status.status == health_pb2.HealthCheckResponse.SERVING


async def test_token_reservations(auth: AuthHarness, unique_tenant: str) -> None:
    key = await create(auth, unique_tenant, limits=pb.KeyLimits(tokens_per_minute=1000))
    reserve = stub(auth).ReserveTokens
    base = {"tenant_id": unique_tenant, "key_id": key.key.key_id}
    granted = await reserve(pb.ReserveTokensRequest(**base, tokens=800, reservation_id="r1"))
    assert (granted.remaining, granted.limit, granted.enforced) == (200, 1000, True)
    assert 47 < granted.reset_after.seconds <= 48
    err = await error_of(reserve(pb.ReserveTokensRequest(**base, tokens=300, reservation_id="r2")))
    assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.quota_violations[0].subject == f"tenant:{unique_tenant}/key:{key.key.key_id}"
    assert err.retry_after_s is not None
    assert 5.9 < err.retry_after_s <= 6.0
    refunded = await stub(auth).RefundTokens(
        pb.RefundTokensRequest(**base, reservation_id="r1", tokens=500)
    )
    assert refunded.remaining == 700
    assert (
        await reserve(pb.ReserveTokensRequest(**base, tokens=300, reservation_id="r2"))
    ).enforced
    err = await error_of(reserve(pb.ReserveTokensRequest(**base, tokens=5000, reservation_id="r3")))
    assert err.code == grpc.StatusCode.FAILED_PRECONDITION
    err = await error_of(
        stub(auth).RefundTokens(pb.RefundTokensRequest(**base, reservation_id="none", tokens=1))
    )
    assert err.code == grpc.StatusCode.NOT_FOUND


async def test_reservations_report_the_limit_that_holds_them(
    redis_url: str, prefix: str, unique_tenant: str
) -> None:
    # The router refunds (and asks auth at all) only when `limit` > 0: a key without a
    # limit of its own under a tenant-wide one must still report a limit, the tenant's.
    settings = make_settings(redis_url, prefix, limits=DefaultLimits(tenant_tokens_per_minute=500))
    async with serving(settings) as harness:
        record, _ = await harness.create_key(unique_tenant)
        base = {"tenant_id": unique_tenant, "key_id": record.key_id}
        reserve = stub(harness).ReserveTokens
        held = await reserve(pb.ReserveTokensRequest(**base, tokens=100, reservation_id="t1"))
        assert (held.limit, held.remaining, held.enforced) == (500, 400, True)
    async with serving(make_settings(redis_url, prefix)) as harness:
        record, _ = await harness.create_key(unique_tenant)
        base = {"tenant_id": unique_tenant, "key_id": record.key_id}
        free = await stub(harness).ReserveTokens(
            pb.ReserveTokensRequest(**base, tokens=100, reservation_id="u1")
        )
        assert (free.limit, free.enforced) == (0, True)  # unlimited: nothing held


async def test_reserve_rejects_keys_of_other_tenants(auth: AuthHarness, unique_tenant: str) -> None:
    key = await create(auth, unique_tenant, limits=pb.KeyLimits(tokens_per_minute=10))
    err = await error_of(
        stub(auth).ReserveTokens(
            pb.ReserveTokensRequest(
                tenant_id="other", key_id=key.key.key_id, tokens=1, reservation_id="x"
            )
        )
    )
    assert err.code == grpc.StatusCode.NOT_FOUND


async def test_concurrency_slots(auth: AuthHarness, unique_tenant: str) -> None:
    record, _ = await auth.create_key(unique_tenant, limits=KeyLimits(max_concurrent=1))
    base = {"tenant_id": unique_tenant, "key_id": record.key_id}
    acquire, release = stub(auth).AcquireConcurrency, stub(auth).ReleaseConcurrency
    held = await acquire(pb.AcquireConcurrencyRequest(**base, lease_id="a"))
    assert (held.in_use, held.limit, held.enforced) == (1, 1, True)
    assert held.HasField("expires_at")
    err = await error_of(acquire(pb.AcquireConcurrencyRequest(**base, lease_id="b")))
    assert err.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.retry_after_s == 1.0
    assert (await release(pb.ReleaseConcurrencyRequest(**base, lease_id="a"))).released
    assert not (await release(pb.ReleaseConcurrencyRequest(**base, lease_id="a"))).released
    await acquire(pb.AcquireConcurrencyRequest(**base, lease_id="b"))
    err = await error_of(
        acquire(
            pb.AcquireConcurrencyRequest(**base, lease_id="", ttl=duration_pb2.Duration(seconds=-1))
        )
    )
    assert {v.field for v in err.field_violations} == {"lease_id", "ttl"}
