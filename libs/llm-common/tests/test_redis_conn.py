"""REDIS_URL / REDIS_CLUSTER_NODES / REDIS_USERNAME / REDIS_PASSWORD handling, cluster URL
parsing, command routing keys, and the one-line start-up error (no Redis needed)."""

from __future__ import annotations

import asyncio

import pytest

from llm_common.config import ConfigError
from llm_common.redis_cluster_mux import first_key
from llm_common.redis_conn import (
    is_cluster_url,
    open_client,
    parse_cluster_url,
    redacted,
    redis_url_from_env,
    verify_redis,
)
from llm_testing import free_port


def test_cluster_nodes_win_over_redis_url_and_carry_credentials() -> None:
    env = {
        "REDIS_URL": "redis://ignored:6379/0",
        "REDIS_CLUSTER_NODES": " 10.0.0.1:7000, 10.0.0.2:7001 ",
        "REDIS_USERNAME": "billing",
        "REDIS_PASSWORD": "p@ss:word",
    }
    url = redis_url_from_env(env, None)
    assert is_cluster_url(url)
    target = parse_cluster_url(url)
    assert target.nodes == (("10.0.0.1", 7000), ("10.0.0.2", 7001))
    assert (target.username, target.password, target.tls) == ("billing", "p@ss:word", False)
    assert "p@ss" not in redacted(url)


def test_tls_cluster_and_single_node_credentials() -> None:
    tls = redis_url_from_env({"REDIS_CLUSTER_NODES": "rediss://h1:6380,h2:6380"}, None)
    assert parse_cluster_url(tls).tls
    single = redis_url_from_env({"REDIS_URL": "rediss://h:6380/0", "REDIS_PASSWORD": "x"}, None)
    assert single == "rediss://:x@h:6380/0"
    assert redis_url_from_env({}, "redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"REDIS_CLUSTER_NODES": "h1"}, "REDIS_CLUSTER_NODES"),
        ({"REDIS_CLUSTER_NODES": "h1:99999"}, "REDIS_CLUSTER_NODES"),
        ({"REDIS_CLUSTER_NODES": "u:p@h1:7000"}, "REDIS_CLUSTER_NODES"),
        ({"REDIS_URL": "http://h:6379"}, "REDIS_URL"),
        ({}, "REDIS_URL"),
    ],
)
def test_bad_values_name_their_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as caught:
        redis_url_from_env(env, None)
    assert caught.value.variable == variable
    assert "\n" not in str(caught.value)


def test_commands_route_by_their_first_key() -> None:
    assert first_key(["EVALSHA", "abc", 2, "k{t}:1", "k{t}:2", "arg"]) == "k{t}:1"
    assert first_key(["EVALSHA", "abc", 0, "arg"]) is None
    assert first_key(["SET", "rid:1", "x"]) == "rid:1"
    assert first_key(["WAIT", 1, 100]) is None


def test_an_unreachable_cluster_is_one_line_naming_the_variable() -> None:
    url = f"redis+cluster://:secret@127.0.0.1:{free_port()}"

    async def check() -> None:
        client = open_client(url, timeout_s=0.5)
        try:
            await verify_redis(client, url)
        finally:
            await client.aclose()

    with pytest.raises(ConfigError) as caught:
        asyncio.run(check())
    message = str(caught.value)
    assert message.startswith("REDIS_CLUSTER_NODES: ")
    assert "\n" not in message
    assert "secret" not in message
