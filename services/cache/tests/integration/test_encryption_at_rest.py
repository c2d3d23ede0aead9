"""Threat 8 (docs/security.md): Redis holds no prompt or response text. Real Lookups and
Stores through CacheService with a master key file, then every key under the prefix is read
raw (DUMP and type-wise reads); ciphertexts are bound to their tenant; master and data keys
rotate while entries keep being served."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis.asyncio

from llm_cache import keyadmin
from llm_cache.canonical import request_key, tenant_tag
from llm_cache.config import Settings
from llm_cache.datakeys import DataKeys
from llm_cache.envelope import DEK_ID_BYTES, KeyRing, new_key_line, read_key_file
from llmapi.cache.v1 import cache_service_pb2 as pb

from ..conftest import Requests, ServeCache, key_file, with_key

pytestmark = [pytest.mark.integration, pytest.mark.security]

PROMPTS = [
    "Which river flows through the city of Zanzibarville?",
    "Explain the Quokkafish migration pattern in detail",
]
ANSWERS = ["The Blorptide river runs through it.", "Quokkafish swim north in Octember."]
# Fragments a leak would show (short enough to catch partial copies).
SECRETS = ["Zanzibarville", "Quokkafish", "Blorptide", "Octember", "migration pattern"]


async def raw_dump(client: Any, prefix: str) -> list[tuple[str, bytes]]:
    """Every key under `prefix` with its DUMP and its contents read type-wise."""
    out = []
    async for name in client.scan_iter(match=f"{prefix}*", count=1000):
        kind = (await client.type(name)).decode()
        parts: list[bytes] = [await client.dump(name) or b""]
        if kind == "hash":
            for f, v in (await client.hgetall(name)).items():
                parts += [f, v]
        elif kind == "string":
            parts.append(await client.get(name) or b"")
        elif kind in ("set",):
            parts += list(await client.smembers(name))
        elif kind == "zset":
            parts += list(await client.zrange(name, 0, -1))
        elif kind == "stream":
            for _, fields in await client.xrange(name):
                for f, v in fields.items():
                    parts += [f, v]
        out.append((name.decode(), b"\x00".join(parts)))
    return out


async def store_and_hit(stub: object, req: Requests, tenant: str = "tenant-a") -> None:
    for prompt, answer in zip(PROMPTS, ANSWERS, strict=True):
        stored = await stub.Store(req.store(req.key(prompt, tenant=tenant), answer))  # type: ignore[attr-defined]
        assert stored.stored
        exact = await stub.Lookup(req.lookup(req.key(prompt, tenant=tenant)))  # type: ignore[attr-defined]
        assert exact.kind == pb.HIT_KIND_EXACT
        assert exact.response.text == answer


async def test_redis_holds_no_prompt_or_response_text(
    make_settings: Callable[..., Settings],
    serve_cache: ServeCache,
    req: Requests,
    redis_client: redis.asyncio.Redis,
    redis_prefix: str,
    tmp_path: Path,
) -> None:
    settings = with_key(make_settings(), key_file(tmp_path, new_key_line("k1")))
    async with serve_cache(settings) as s:
        await store_and_hit(s.stub, req)
        reworded = req.key("Which river flows through the city of Zanzibarville??")
        semantic = await s.stub.Lookup(req.lookup(reworded))
        assert semantic.kind == pb.HIT_KIND_SEMANTIC
        assert semantic.response.text == ANSWERS[0]
        blocked = await s.stub.Feedback(
            pb.FeedbackRequest(tenant_id="tenant-a", entry_id=semantic.entry_id, key=reworded)
        )
        assert blocked.pair_blocked
        await s.stub.Store(req.store(req.key(PROMPTS[0]), ANSWERS[0]))
        assert s.app.engine is not None
        vectors = []
        for prompt in PROMPTS:
            text = request_key(req.key(prompt)).semantic_text
            assert text is not None
            embedded = await s.app.engine.embed(text)
            vectors.append(np.asarray(embedded.vector, np.float32).tobytes()[:32])

    dump = await raw_dump(redis_client, redis_prefix)
    names = [name for name, _ in dump]
    for part in (":dek", ":blk", ":sz", ":lru"):
        assert any(name.endswith(part) for name in names), part
    assert any(":e:" in name for name in names)
    assert any("log:" in name for name in names)
    for name, raw in dump:
        for secret in SECRETS:
            for encoding in ("utf-8", "utf-16-le"):
                assert secret.encode(encoding) not in raw, (name, secret)
        for vector in vectors:  # the embeddings are sealed too
            assert vector not in raw, name


async def test_a_tenants_ciphertext_does_not_open_as_another_tenant(
    make_settings: Callable[..., Settings],
    serve_cache: ServeCache,
    req: Requests,
    redis_client: redis.asyncio.Redis,
    redis_prefix: str,
    tmp_path: Path,
) -> None:
    settings = with_key(make_settings(), key_file(tmp_path, new_key_line("k1")))
    async with serve_cache(settings) as s:
        await store_and_hit(s.stub, req, tenant="tenant-a")
        await store_and_hit(s.stub, req, tenant="tenant-b")
        a = request_key(req.key(PROMPTS[0], tenant="tenant-a"))
        b = request_key(req.key(PROMPTS[0], tenant="tenant-b"))
        a_entry = f"{redis_prefix}{{{tenant_tag('tenant-a')}}}:e:{a.entry_id}"
        b_entry = f"{redis_prefix}{{{tenant_tag('tenant-b')}}}:e:{b.entry_id}"
        # An attacker with write access copies A's sealed response, and A's wrapped data
        # key under B's key id, into B's entry: it opens under neither binding.
        sealed_a = await redis_client.hget(a_entry, "r")
        await redis_client.hset(b_entry, "r", sealed_a)
        wrapped_a = await redis_client.hgetall(f"{redis_prefix}{{{tenant_tag('tenant-a')}}}:dek")
        b_dek = f"{redis_prefix}{{{tenant_tag('tenant-b')}}}:dek"
        await redis_client.hset(b_dek, mapping=dict(wrapped_a))  # type: ignore[arg-type]
        s.app.store.sealer.keys.drop_cached(tenant_tag("tenant-b"))  # type: ignore[union-attr]
        miss = await s.stub.Lookup(req.lookup(req.key(PROMPTS[0], tenant="tenant-b")))
        assert miss.kind == pb.HIT_KIND_MISS
        assert (await s.stub.Lookup(req.lookup(req.key(PROMPTS[0], tenant="tenant-a")))).kind == (
            pb.HIT_KIND_EXACT
        )


async def test_keys_rotate_while_entries_are_served(
    make_settings: Callable[..., Settings],
    serve_cache: ServeCache,
    req: Requests,
    redis_client: redis.asyncio.Redis,
    redis_prefix: str,
    tmp_path: Path,
) -> None:
    old, new = new_key_line("k1"), new_key_line("k2")
    base = make_settings()
    async with serve_cache(with_key(base, key_file(tmp_path, old))) as s:
        await store_and_hit(s.stub, req)
    # Master key rotation, step 2 of 3: k2 active, k1 still unwraps.
    async with serve_cache(with_key(base, key_file(tmp_path, new, old))) as s:
        for prompt, answer in zip(PROMPTS, ANSWERS, strict=True):
            hit = await s.stub.Lookup(req.lookup(req.key(prompt)))
            assert hit.kind == pb.HIT_KIND_EXACT
            assert hit.response.text == answer
        keys = s.app.store.sealer.keys  # type: ignore[union-attr]
        tag = tenant_tag("tenant-a")
        # Data key rotation: new values use the new key, old values still open.
        before = await keys.active(tag)
        rotated = await keys.rotate(tag)
        assert rotated.dek_id != before.dek_id
        await s.stub.Store(req.store(req.key("A brand new question about Octember"), "Fresh."))
        new_entry = request_key(req.key("A brand new question about Octember")).entry_id
        sealed = await redis_client.hget(f"{redis_prefix}{{{tag}}}:e:{new_entry}", "r")
        assert isinstance(sealed, bytes)
        assert sealed[1 : 1 + DEK_ID_BYTES] == rotated.dek_id
        assert (await s.stub.Lookup(req.lookup(req.key(PROMPTS[1])))).response.text == ANSWERS[1]
        # Step 3: rewrap every data key with k2, after which k1 can be retired.
        assert await keys.rewrap(tag) == 1  # the first key; the rotated one is k2's already
    async with serve_cache(with_key(base, key_file(tmp_path, new))) as s:
        for prompt, answer in zip(PROMPTS, ANSWERS, strict=True):
            hit = await s.stub.Lookup(req.lookup(req.key(prompt)))
            assert hit.kind == pb.HIT_KIND_EXACT
            assert hit.response.text == answer
        hit = await s.stub.Lookup(req.lookup(req.key("A brand new question about Octember")))
        assert hit.response.text == "Fresh."


async def test_the_index_is_rebuilt_from_sealed_entries(
    make_settings: Callable[..., Settings],
    serve_cache: ServeCache,
    req: Requests,
    tmp_path: Path,
) -> None:
    settings = with_key(make_settings(), key_file(tmp_path, new_key_line("k1")))
    async with serve_cache(settings) as s:
        await store_and_hit(s.stub, req)
    async with serve_cache(settings) as s:  # a fresh replica: its index comes from Redis
        assert s.app.engine is not None
        assert s.app.engine.indexed == len(PROMPTS)
        reworded = req.key("Which river flows through the city of Zanzibarville??")
        assert (await s.stub.Lookup(req.lookup(reworded))).kind == pb.HIT_KIND_SEMANTIC


def test_key_files_are_checked(tmp_path: Path) -> None:
    path = key_file(tmp_path, new_key_line("k2"), new_key_line("k1"))
    ring = read_key_file(path)
    assert isinstance(ring, KeyRing)
    assert ring.key_ids() == ("k2", "k1")
    path.chmod(0o644)
    with pytest.raises(ValueError, match="readable by others"):
        read_key_file(path)
    bad = key_file(tmp_path, "k1:c2hvcnQ=")
    with pytest.raises(ValueError, match="line 1"):
        read_key_file(bad)


async def test_keyadmin_rewraps_every_tenant_and_rotates_one(
    make_settings: Callable[..., Settings],
    redis_client: redis.asyncio.Redis,
    redis_prefix: str,
    tmp_path: Path,
) -> None:
    old, new = new_key_line("k1"), new_key_line("k2")
    settings = with_key(make_settings(), key_file(tmp_path, old))
    before = {}
    for tenant in ("tenant-a", "tenant-b"):
        ring = read_key_file(key_file(tmp_path, old))
        keys = DataKeys(redis_client, redis_prefix, ring)
        before[tenant] = await keys.active(tenant_tag(tenant))
        await redis_client.sadd(f"{redis_prefix}tenants", tenant_tag(tenant))
    settings = with_key(settings, key_file(tmp_path, new, old))
    assert await keyadmin.rewrap_all(settings) == 2
    assert await keyadmin.rewrap_all(settings) == 0  # all wrapped by k2 now
    only_new = DataKeys(redis_client, redis_prefix, read_key_file(key_file(tmp_path, new)))
    for tenant, key in before.items():
        opened = await only_new.get(tenant_tag(tenant), key.dek_id)
        assert opened is not None
        assert opened.open("e", "r", key.seal("e", "r", b"still here")) == b"still here"
    rotated = await keyadmin.rotate_tenant(settings, "tenant-a")
    assert rotated != before["tenant-a"].dek_id.hex()
    assert (await only_new.active(tenant_tag("tenant-a"))).dek_id.hex() == rotated


async def test_keyadmin_command_is_audited(
    redis_url: str, redis_prefix: str, redis_client: redis.asyncio.Redis, tmp_path: Path
) -> None:
    audit = tmp_path / "audit.log"
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "CACHE_KEY_PREFIX": redis_prefix,
        "CACHE_MASTER_KEY_FILE": str(key_file(tmp_path, new_key_line("k1"))),
        "AUDIT_LOG_FILE": str(audit),
    }
    command = [sys.executable, "-m", "llm_cache.keyadmin", "rotate-tenant", "tenant-a"]
    done = await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    stdout, stderr = await asyncio.wait_for(done.communicate(), timeout=60)
    assert done.returncode == 0, stderr.decode()
    dek_id = stdout.decode().split()[-1]
    stored = await redis_client.hget(f"{redis_prefix}{{{tenant_tag('tenant-a')}}}:dek", "active")
    assert stored == dek_id.encode()
    (event,) = [json.loads(line) for line in audit.read_text().splitlines()]
    assert (event["action"], event["target"], event["outcome"]) == (
        "cache.keys.rotate",
        "tenant:tenant-a",
        "OK",
    )
    assert event["details"]["data_key"] == dek_id
