"""Threats 8 and 9 (docs/security.md) on the whole stack: the cache's Redis holds no prompt
or response text, and `llmctl tenants forget` (through the edge, admin only) erases a
tenant's keys, cached entries and request records."""

from __future__ import annotations

import asyncio
import io
import time

import pytest
import redis.asyncio

from llm_cache.canonical import tenant_tag

from .conftest import RunningStack

pytestmark = [pytest.mark.e2e, pytest.mark.security]

TENANT = "e2e-forget"
PROMPT = "Please recite the zyxwvut ledger of Quibbleton"


def llmctl(stack: RunningStack, *args: str, key: str | None = None) -> tuple[int, str, str]:
    from llmctl.cli import main

    env = {"LLM_API_ADDR": stack.edge, "LLM_API_KEY": key or stack.admin_key}
    out, err = io.StringIO(), io.StringIO()
    code = main(list(args), env, stdin=io.StringIO(""), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


async def cache_keys(stack: RunningStack) -> dict[bytes, bytes]:
    """Every cache key of the stack with its DUMP."""
    client = redis.asyncio.Redis.from_url(stack.redis_url)
    try:
        names = [n async for n in client.scan_iter(match=f"{stack.prefix}llmcache:*")]
        return {n: await client.dump(n) or b"" for n in names}
    finally:
        await client.aclose()


def test_forget_erases_a_tenant_through_the_edge(stack: RunningStack) -> None:
    secret = stack.create_key(tenant=TENANT)
    for _ in range(2):  # the second answer comes from the cache
        code, out, err = llmctl(
            stack, "chat", PROMPT, "--temperature", "0", "--max-tokens", "8", key=secret
        )
        assert code == 0, err
    answer = out.strip()
    tag = tenant_tag(TENANT).encode()
    dumps = asyncio.run(cache_keys(stack))
    assert any(tag in name for name in dumps)
    for name, raw in dumps.items():
        assert b"Quibbleton" not in raw, name
        if len(answer) >= 8:
            assert answer.encode() not in raw, name

    code, _, err = llmctl(stack, "tenants", "forget", TENANT, "--yes", key=secret)
    assert code == 1  # not an admin key: refused at the first step, nothing erased
    assert "PERMISSION_DENIED" in _ + err

    deadline, outputs = time.monotonic() + 30, []
    while True:  # billing refuses until the tenant's usage has reached its store
        code, out, err = llmctl(stack, "tenants", "forget", TENANT, "--yes")
        outputs.append(out)
        if code == 0 or time.monotonic() > deadline:
            break
        assert "billing  failed: FAILED_PRECONDITION" in out, out + err
        time.sleep(1)
    assert code == 0, out + err
    everything = "".join(outputs)  # a repeated run finds auth and the cache already done
    assert "auth     1 API keys deleted" in everything
    assert "cache    1 cached entries removed, data keys destroyed" in everything
    assert "billing  2 request records deleted" in out
    assert f"tenant {TENANT} forgotten" in out
    assert not any(tag in name for name in asyncio.run(cache_keys(stack)))
    code, _, err = llmctl(stack, "chat", "hi", key=secret)
    assert code == 1
    assert err.startswith("llmctl: UNAUTHENTICATED")
