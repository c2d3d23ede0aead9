"""Key administration is audited (issue 32): create, list, rotate, revoke and refused attempts
become audit events naming who, what, the outcome and from where, never a secret (real auth
server on port 0, real Redis)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Iterator

import grpc
import pytest
import pytest_asyncio

from llm_auth.apikeys import generate_key, parse_key
from llm_auth.testing import AuthHarness, make_settings, serving
from llm_common.audit import AUDIT_LOGGER
from llmapi.auth.v1 import auth_service_pb2 as pb
from llmapi.auth.v1 import auth_service_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.integration, pytest.mark.security]

BOOTSTRAP = generate_key().text


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def events(self) -> list[dict[str, object]]:
        return [json.loads(line) for line in self.lines]


@pytest.fixture
def audit() -> Iterator[Lines]:
    handler, logger = Lines(), logging.getLogger(AUDIT_LOGGER)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)  # not `.level =`: setLevel clears isEnabledFor's cache
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


@pytest_asyncio.fixture
async def auth(redis_url: str, prefix: str) -> AsyncIterator[AuthHarness]:
    settings = make_settings(redis_url, prefix, bootstrap_admin_key=BOOTSTRAP)
    async with serving(settings) as harness:
        await asyncio.wait_for(harness.app.wait_bootstrapped(), 10)
        yield harness


async def test_key_administration_is_audited_without_secrets(
    auth: AuthHarness, audit: Lines, unique_tenant: str
) -> None:
    stub = pb_grpc.AuthServiceStub(auth.channel)
    root = [("x-api-key", BOOTSTRAP), ("x-forwarded-for", "203.0.113.5")]
    admin_id = parse_key(BOOTSTRAP).key_id
    created = await stub.CreateKey(
        pb.CreateKeyRequest(tenant_id=unique_tenant, name="ci"), metadata=root
    )
    key_id = created.key.key_id
    await stub.ListKeys(pb.ListKeysRequest(tenant_id=unique_tenant), metadata=root)
    rotated = await stub.RotateKey(pb.RotateKeyRequest(key_id=key_id), metadata=root)
    await stub.RevokeKey(pb.RevokeKeyRequest(key_id=key_id), metadata=root)
    # A non-admin key trying to revoke: refused, and audited as such.
    with pytest.raises(grpc.aio.AioRpcError):
        await stub.RevokeKey(
            pb.RevokeKeyRequest(key_id=key_id), metadata=[("x-api-key", created.secret)]
        )
    events = audit.events()
    assert [(e["action"], e["outcome"]) for e in events] == [
        ("key.create", "OK"),
        ("key.list", "OK"),
        ("key.rotate", "OK"),
        ("key.revoke", "OK"),
        ("key.revoke", "UNAUTHENTICATED"),
    ]
    first = events[0]
    assert (first["actor"], first["actor_tenant"]) == (admin_id, "system")
    assert first["target"] == f"tenant:{unique_tenant}"
    assert first["details"]["key_id"] == key_id  # type: ignore[index]
    assert first["details"]["forwarded_for"] == "203.0.113.5"  # type: ignore[index]
    assert str(first["source"]).startswith(("ipv4:", "ipv6:"))
    assert events[3]["target"] == f"key:{key_id}"
    assert events[4]["actor"] == "-"
    text = "\n".join(audit.lines)
    for secret in (BOOTSTRAP, created.secret, rotated.secret):
        assert parse_key(secret).secret not in text
