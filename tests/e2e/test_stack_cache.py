"""Through the edge: a repeated deterministic request is answered from the router's near
cache, which the cache's change feed (through the mesh) keeps honest: an admin Invalidate
at the edge is followed, within the feed's delay, by misses."""

from __future__ import annotations

import re
import time
import urllib.request

import grpc
import pytest

from llmapi.cache.v1 import cache_service_pb2 as cache_pb
from llmapi.cache.v1 import cache_service_pb2_grpc as cache_grpc
from llmapi.llm.v1 import llm_service_pb2 as pb

from .conftest import RunningStack
from .test_stack_grpc import bearer, chat_request, stream_chat

pytestmark = pytest.mark.e2e

TENANT = "e2e-near-cache"
# The feed delivers a change in milliseconds; this only spares the test a slow machine's
# scheduling hiccup.
FEED_DELAY_S = 2.0


def near_hits(stack: RunningStack) -> float:
    url = f"http://{stack.endpoints.metrics['router']}/metrics"
    with urllib.request.urlopen(url, timeout=5) as response:
        body = response.read().decode()
    found = re.search(r'^llm_router_near_cache_total\{event="hit"\} (\S+)$', body, re.M)
    return float(found.group(1)) if found else 0.0


def hit_kind(channel: grpc.Channel, key: str, text: str) -> pb.CacheHit.ValueType:
    return stream_chat(channel, key, chat_request(text, max_tokens=4))[0].cache.hit


def until(
    kind: pb.CacheHit.ValueType, channel: grpc.Channel, key: str, text: str, timeout_s: float
) -> float:
    """Repeat the chat until its answer is of `kind`; returns how long that took."""
    started = time.monotonic()
    while hit_kind(channel, key, text) != kind:
        assert time.monotonic() - started < timeout_s, f"no {pb.CacheHit.Name(kind)} answer"
        time.sleep(0.05)
    return time.monotonic() - started


def test_near_cache_hits_and_invalidation_through_the_edge(stack: RunningStack) -> None:
    key = stack.create_key(tenant=TENANT, name="near cache", requests_per_minute=0)
    text = "Which birds nest on cliffs?"
    with grpc.insecure_channel(stack.edge) as channel:
        assert hit_kind(channel, key, text) == pb.CACHE_HIT_MISS
        until(pb.CACHE_HIT_EXACT, channel, key, text, timeout_s=10.0)  # the store landed
        before = near_hits(stack)
        for _ in range(3):
            assert hit_kind(channel, key, text) == pb.CACHE_HIT_EXACT
        assert near_hits(stack) >= before + 2  # the first may still have asked the cache
        removed = cache_grpc.CacheServiceStub(channel).Invalidate(
            cache_pb.InvalidateRequest(tenant_id=TENANT),
            metadata=bearer(stack.admin_key),
            timeout=10,
        )
        assert removed.removed == 1
        until(pb.CACHE_HIT_MISS, channel, key, text, timeout_s=FEED_DELAY_S)
