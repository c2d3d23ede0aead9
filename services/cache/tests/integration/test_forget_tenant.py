"""Threat 9 (docs/security.md), the cache's part: ForgetTenant removes everything of one
tenant and nothing of another; a copy of its ciphertext restored afterwards does not open (its
data key is gone), and once the master key of the time is retired, neither does a whole backup
from before the erasure (docs/adr/0017)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis.asyncio

from llm_cache.canonical import tenant_tag
from llm_cache.config import Settings
from llm_cache.envelope import new_key_line
from llm_common.audit import AUDIT_LOGGER
from llm_common.errors import parse_error
from llmapi.cache.v1 import cache_service_pb2 as pb

from ..conftest import Requests, ServeCache, key_file, with_key

pytestmark = [pytest.mark.integration, pytest.mark.security]

GONE, KEPT = "tenant-gone", "tenant-kept"
PROMPTS = ["What is the capital of France?", "How tall is the Eiffel tower?"]


async def fill(stub: Any, req: Requests, tenant: str) -> None:
    for prompt in PROMPTS:
        assert (await stub.Store(req.store(req.key(prompt, tenant=tenant), "Answer."))).stored
    reworded = req.key("What's the capital of France?", tenant=tenant)
    hit = await stub.Lookup(req.lookup(reworded))
    assert hit.kind == pb.HIT_KIND_SEMANTIC
    await stub.Feedback(pb.FeedbackRequest(tenant_id=tenant, entry_id=hit.entry_id, key=reworded))
    await stub.Store(req.store(req.key(PROMPTS[0], tenant=tenant), "Answer."))


async def backup(client: Any, prefix: str, tag: str) -> dict[bytes, bytes]:
    """DUMPs of the tenant's keys: what a Redis backup holds of it."""
    names = [n async for n in client.scan_iter(match=f"{prefix}{{{tag}}}:*")]
    return {n: await client.dump(n) for n in names}


async def restore(client: Any, dumps: dict[bytes, bytes], *, with_data_keys: bool) -> None:
    for name, dumped in dumps.items():
        if with_data_keys or not name.endswith(b":dek"):
            await client.restore(name, 0, dumped, replace=True)


async def hits(stub: Any, req: Requests, tenant: str) -> list[int]:
    return [(await stub.Lookup(req.lookup(req.key(p, tenant=tenant)))).kind for p in PROMPTS]


async def test_forget_removes_one_tenant_and_shreds_its_copies(
    make_settings: Callable[..., Settings],
    serve_cache: ServeCache,
    req: Requests,
    redis_client: redis.asyncio.Redis,
    redis_prefix: str,
    tmp_path: Path,
) -> None:
    k1, k2 = new_key_line("k1"), new_key_line("k2")
    base = make_settings()
    exact = [pb.HIT_KIND_EXACT] * len(PROMPTS)
    async with serve_cache(with_key(base, key_file(tmp_path, k1))) as s:
        await fill(s.stub, req, GONE)
        await fill(s.stub, req, KEPT)
        kept_before = await backup(redis_client, redis_prefix, tenant_tag(KEPT))
        saved = await backup(redis_client, redis_prefix, tenant_tag(GONE))
        assert any(n.endswith(b":dek") for n in saved)
        assert any(n.endswith(b":blk") for n in saved)

        reply = await s.stub.ForgetTenant(pb.ForgetTenantRequest(tenant_id=GONE))
        assert reply.entries_removed == len(PROMPTS)
        assert reply.keys_destroyed
        assert await backup(redis_client, redis_prefix, tenant_tag(GONE)) == {}
        tenants = await redis_client.smembers(f"{redis_prefix}tenants")
        assert tenant_tag(GONE).encode() not in tenants
        assert tenant_tag(KEPT).encode() in tenants
        kept_after = await backup(redis_client, redis_prefix, tenant_tag(KEPT))
        assert kept_after.keys() == kept_before.keys()
        assert await hits(s.stub, req, KEPT) == exact
        assert await hits(s.stub, req, GONE) == [pb.HIT_KIND_MISS] * len(PROMPTS)

        # A replica or backup still holding the entries (not the destroyed data key).
        await restore(redis_client, saved, with_data_keys=False)
        s.app.store.sealer.keys.drop_cached(tenant_tag(GONE))  # type: ignore[union-attr]
        assert await hits(s.stub, req, GONE) == [pb.HIT_KIND_MISS] * len(PROMPTS)

        # The limit: a whole backup, wrapped data key included, opens under the master key
        # that wrapped it, so erasure completes when that master key is retired.
        await restore(redis_client, saved, with_data_keys=True)
        assert await hits(s.stub, req, GONE) == exact
        await s.stub.ForgetTenant(pb.ForgetTenantRequest(tenant_id=GONE))

    async with serve_cache(with_key(base, key_file(tmp_path, k2, k1))) as s:
        keys = s.app.store.sealer.keys  # type: ignore[union-attr]
        assert await keys.rewrap(tenant_tag(KEPT)) == 1
    async with serve_cache(with_key(base, key_file(tmp_path, k2))) as s:  # k1 retired
        await restore(redis_client, saved, with_data_keys=True)
        assert await hits(s.stub, req, GONE) == [pb.HIT_KIND_MISS] * len(PROMPTS)
        assert await hits(s.stub, req, KEPT) == exact


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append(json.loads(record.getMessage()))


@pytest.fixture
def audit() -> Iterator[Lines]:
    handler, logger = Lines(), logging.getLogger(AUDIT_LOGGER)
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)  # setLevel, not `.level =`: it clears isEnabledFor's cache
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


async def test_forget_validates_and_audits(
    make_settings: Callable[..., Settings],
    serve_cache: ServeCache,
    tmp_path: Path,
    audit: Lines,
) -> None:
    settings = with_key(make_settings(), key_file(tmp_path, new_key_line("k1")))
    metadata = [("x-key-id", "0123456789abcdef"), ("x-tenant-id", "system")]
    async with serve_cache(settings) as s:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await s.stub.ForgetTenant(pb.ForgetTenantRequest(tenant_id=""), metadata=metadata)
        error = parse_error(refused.value)
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT
        assert {v.field for v in error.field_violations} == {"tenant_id"}
        request = pb.ForgetTenantRequest(tenant_id="never-seen")
        reply = await s.stub.ForgetTenant(request, metadata=metadata)
        assert reply.entries_removed == 0
    (event,) = audit.events  # refused by validation: nothing changed, not audited
    assert (event["action"], event["outcome"], event["target"]) == (
        "tenant.forget",
        "OK",
        "tenant:never-seen",
    )
    assert (event["actor"], event["actor_tenant"]) == ("0123456789abcdef", "system")
