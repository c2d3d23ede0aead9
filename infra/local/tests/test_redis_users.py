"""The stack's own Redis runs with one ACL user per service (threat 7, docs/security.md):
passwords generated once (0600) and reused, the ACL file holds hashes only, each service gets
its own REDIS_URL, and the real redis-server the stack starts refuses the default user."""

from __future__ import annotations

import contextlib
import socket
import stat
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
import yaml
from redis.exceptions import AuthenticationError, NoPermissionError

from llm_common.ports import free_port
from llm_common.redis_conn import open_sync_client
from llm_stack import probes, redis_cluster
from llm_stack.config import StackConfig
from llm_stack.credentials import ensure_credentials
from llm_stack.process import ManagedProcess
from llm_stack.redis_server import redis_spec
from llm_stack.redis_users import ACL_FILE, ensure_redis_users, env_file
from llm_stack.specs import Shared, core_specs
from llm_stack.stack import Stack
from llm_testing import redis_reachable

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.security


def test_passwords_are_private_stable_and_absent_from_the_acl_file(tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    first = ensure_redis_users(secrets, "p:")
    for user in (*first.services, "probe"):
        assert stat.S_IMODE(env_file(secrets, user).stat().st_mode) == 0o600
    again = ensure_redis_users(secrets, "p:")
    assert again.services == first.services  # reused on restart
    assert again.probe_password == first.probe_password
    acl = (secrets / ACL_FILE).read_text()
    assert "user default off" in acl
    assert "~p:auth:* &p:auth:key-events" in acl
    for service_user in first.services.values():
        assert service_user.password not in acl
    assert len({u.password for u in first.services.values()}) == len(first.services)


def test_each_service_gets_its_own_redis_user(tmp_path: Path) -> None:
    config = StackConfig.from_env(REPO, {"LLM_RUN_DIR": str(tmp_path)})
    users = ensure_redis_users(tmp_path / "secrets")
    shared = Shared(
        config,
        "redis://127.0.0.1:6380/0",
        tmp_path / "models.yaml",
        ensure_credentials(tmp_path / "secrets"),
        users,
    )
    urls = {s.name: s.env.get("REDIS_URL") for s in core_specs(shared)}
    for service, user in users.services.items():
        assert urls[service] == f"redis://{service}:{user.password}@127.0.0.1:6380/0"
    assert urls["tokenizer"] is None  # no Redis at all
    assert urls["router"] is None


def test_the_stack_s_redis_refuses_the_default_user_and_other_services_keys(
    tmp_path: Path,
) -> None:
    users = ensure_redis_users(tmp_path / "secrets")
    spec = redis_spec(tmp_path, free_port(), {}, users.acl_path)
    process = ManagedProcess(spec)
    process.start()
    try:
        url = spec.meta["url"]
        assert _eventually(lambda: redis_reachable(users.probe_url(url)))
        with redis.Redis.from_url(url) as anonymous, pytest.raises(AuthenticationError):
            anonymous.ping()
        with redis.Redis.from_url(users.url_for(url, "cache")) as cache:
            cache.set("llmcache:x", "1")
            with pytest.raises(NoPermissionError):
                cache.get("auth:key:{k1}")
        probe = redis.Redis.from_url(users.probe_url(url))
        with probe, pytest.raises(NoPermissionError):
            probe.get("llmcache:x")
        # LLM_REDIS_USERS=1: an operator's Redis that loaded the file gets the same users.
        env = {"LLM_RUN_DIR": str(tmp_path), "REDIS_URL": url, "LLM_REDIS_USERS": "1"}
        stack = Stack(StackConfig.from_env(REPO, env))
        assert stack._start_redis() == url
        assert stack._redis_users == users
    finally:
        process.stop()
    log = spec.log.read_text(errors="replace")
    for user in users.services.values():
        assert user.password not in log


def _eventually(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)  # a child process starting: there is no readiness event
    return False


def test_compose_loads_the_acl_file_and_gives_each_service_its_user() -> None:
    compose = yaml.safe_load((REPO / "infra" / "compose.yaml").read_text())["services"]
    command = compose["redis"]["command"]
    assert command[command.index("--aclfile") + 1] == "/etc/redis/users.acl"
    assert f"../.run/secrets/{ACL_FILE}:/etc/redis/users.acl:ro" in compose["redis"]["volumes"]
    for service in ("auth", "cache", "billing"):
        assert compose[service]["env_file"] == f"../.run/secrets/redis-{service}.env"
        assert "REDIS_PASSWORD" not in compose[service]["environment"]


def _cluster_ports(count: int = 6) -> list[int]:
    """Free ports whose cluster bus port (+10000) is free too."""
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port + 10000 < 65536 and redis_cluster_port_free(port + 10000) and port not in ports:
            ports.append(port)
    return ports


def redis_cluster_port_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_the_local_cluster_nodes_have_the_same_users(tmp_path: Path) -> None:
    users = ensure_redis_users(tmp_path / "secrets", admin=True)
    ports = _cluster_ports()
    node_specs = redis_cluster.node_specs(tmp_path, ports, {}, users)
    assert users.admin_password is not None
    for spec in node_specs:  # the replication password is in a 0600 file, not in argv
        assert users.admin_password not in " ".join(spec.argv)
    nodes = [ManagedProcess(s) for s in node_specs]
    for node in nodes:
        node.start()
    try:
        node_urls = [users.probe_url(f"redis://127.0.0.1:{p}/0") for p in ports]
        assert _eventually(lambda: all(redis_reachable(u) for u in node_urls))
        redis_cluster.create(ports, users)
        url = redis_cluster.cluster_url(ports)
        assert _eventually(lambda: probes.redis_ready(users.probe_url(url)), 30)
        cache = open_sync_client(users.url_for(url, "cache"))
        with contextlib.closing(cache):
            cache.set("llmcache:{t}:x", "1")
            with pytest.raises(NoPermissionError):
                cache.get("auth:key:{k1}")
        with redis.Redis(port=ports[0]) as anonymous, pytest.raises(AuthenticationError):
            anonymous.ping()
    finally:
        for node in nodes:
            node.stop()
