"""Scenario: auth killed. ext_authz fails closed: every call through the edge is refused with
UNAVAILABLE (503 over HTTP), none reaches the router without an identity, and calls succeed
again once auth is back.

Regression: the edge forwarded the client's `content-type: application/grpc` to the HTTP check.
A check that could not reach auth then came back as Envoy's gRPC-shaped local reply (HTTP 200),
which ext_authz took for "allowed": gRPC calls went on to the router with no identity and got
UNAUTHENTICATED, a credential error a client will not retry."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections import Counter

import grpc
import pytest

from .conftest import ChaosStack
from .harness import chat, record

pytestmark = pytest.mark.chaos

OUTAGE_S = 6.0


def _http_chat(edge: str, key: str) -> int:
    body = {"model": "demo", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    request = urllib.request.Request(
        f"http://{edge}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"authorization": f"Bearer {key}", "content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def test_auth_down_fails_closed_as_unavailable(chaos_stack: ChaosStack) -> None:
    auth, key = chaos_stack.process("auth"), chaos_stack.demo_key
    auth.kill()  # SIGKILL
    try:
        grpc_codes: Counter[str] = Counter()
        http_codes: Counter[int] = Counter()
        with grpc.insecure_channel(chaos_stack.edge) as channel:
            ends = time.monotonic() + OUTAGE_S
            while time.monotonic() < ends:
                grpc_codes[chat(channel, key, "auth is down", max_tokens=2).code] += 1
                http_codes[_http_chat(chaos_stack.edge, key)] += 1
    finally:
        auth.start()
    chaos_stack.wait_serving("auth", 60)
    chaos_stack.wait_envoy_healthy("auth_http")
    with grpc.insecure_channel(chaos_stack.edge) as channel:
        after = chat(channel, key, "auth is back", max_tokens=2).code
    record(
        "auth_down",
        {"grpc": dict(grpc_codes), "http": dict(http_codes), "after": after},
    )
    assert set(grpc_codes) == {"UNAVAILABLE"}, grpc_codes
    assert set(http_codes) == {503}, http_codes
    assert sum(grpc_codes.values()) >= 5
    assert after == "OK"
