"""The change log's shards: their streams spread over the slot space, a tenant keeps one."""

from __future__ import annotations

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from llm_cache.canonical import tenant_tag
from llm_cache.changes import LOG_SHARDS, log_streams, shard_of


def test_each_shard_lies_in_its_own_stretch_of_the_slots() -> None:
    streams = log_streams("cache:")
    assert len(streams) == len(set(streams)) == LOG_SHARDS
    stretch = REDIS_CLUSTER_HASH_SLOTS // LOG_SHARDS
    for shard, stream in enumerate(streams):
        assert stream.startswith("cache:log:{")
        assert key_slot(stream.encode()) // stretch == shard


def test_three_equal_masters_each_hold_some_shards() -> None:
    thirds = [key_slot(s.encode()) * 3 // REDIS_CLUSTER_HASH_SLOTS for s in log_streams("p:")]
    assert sorted(set(thirds)) == [0, 1, 2]
    assert max(thirds.count(m) for m in range(3)) <= 3


def test_the_prefix_does_not_move_a_shard() -> None:
    assert [key_slot(s.encode()) for s in log_streams("a:")] == [
        key_slot(s.encode()) for s in log_streams("another-prefix:")
    ]


def test_tenants_spread_over_the_shards_and_keep_theirs() -> None:
    tags = [tenant_tag(f"tenant-{i}") for i in range(800)]
    counts = [0] * LOG_SHARDS
    for tag in tags:
        counts[shard_of(tag)] += 1
        assert shard_of(tag) == shard_of(tag)
    assert min(counts) > 800 / LOG_SHARDS / 2
