"""Issue 32, finding 6: the edge's 401/403/429 on the OpenAI API (`/v1/...`) carry OpenAI's
error object, so OpenAI SDKs and litellm classify them (real auth HTTP listener, real Redis)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from llm_auth.failure_throttle import ThrottleSettings
from llm_auth.metrics import AuthMetrics
from llm_auth.testing import AuthHarness, delete_prefix, make_settings, serving, unique_prefix

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.security]

BAD = "sk-0123456789abcdef.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
OPENAI_KEYS = {"message", "type", "param", "code"}


@pytest_asyncio.fixture
async def auth(redis_url: str) -> AsyncIterator[AuthHarness]:
    prefix = unique_prefix()
    settings = make_settings(
        redis_url, prefix, http_authz_port=0, failed_auth=ThrottleSettings(limit=2)
    )
    try:
        async with serving(settings, AuthMetrics(CollectorRegistry())) as h:
            yield h
    finally:
        await delete_prefix(redis_url, prefix)


async def check(auth: AuthHarness, target: str, key: str) -> tuple[int, dict[str, Any]]:
    assert auth.app.http_authz is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", auth.app.http_authz.port)
    head = [f"POST {target} HTTP/1.1", "host: auth", "content-length: 0", f"x-api-key: {key}"]
    writer.write(("\r\n".join([*head, "x-forwarded-for: 203.0.113.9"]) + "\r\n\r\n").encode())
    try:
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        status_line, *lines = raw[:-4].decode().split("\r\n")
        headers = {k.lower(): v for k, v in (line.split(": ", 1) for line in lines)}
        body = await reader.readexactly(int(headers["content-length"]))
    finally:
        writer.close()
    assert headers["content-type"] == "application/json"
    return int(status_line.split(" ")[1]), json.loads(body)


async def test_v1_denials_are_openai_errors(auth: AuthHarness) -> None:
    status, body = await check(auth, "/authz/v1/chat/completions", BAD)
    assert status == 401
    assert set(body["error"]) == OPENAI_KEYS
    assert (body["error"]["type"], body["error"]["code"]) == (
        "authentication_error",
        "invalid_api_key",
    )
    assert body["error"]["param"] is None
    _, key = await auth.create_key("acme", scopes=("embedding:read",))
    status, body = await check(auth, "/authz;scopes=completion:write/v1/chat/completions", key.text)
    assert status == 403
    assert set(body["error"]) == OPENAI_KEYS
    assert body["error"]["type"] == "permission_error"
    assert body["error"]["message"]
    await check(auth, "/authz/v1/models", BAD)  # the second failure: the limit is 2
    status, body = await check(auth, "/authz/v1/models", BAD)
    assert status == 429
    assert (body["error"]["type"], body["error"]["code"]) == (
        "rate_limit_error",
        "rate_limit_exceeded",
    )


async def test_other_paths_keep_the_rich_json_error(auth: AuthHarness) -> None:
    status, body = await check(auth, "/authz/llmapi.llm.v1.LLMService/Chat", BAD)
    assert status == 401
    assert body["error"]["reason"] == "API_KEY_INVALID"
