"""`make up REDIS_CLUSTER=1`: the stack's Redis as a local Redis Cluster, 3 masters + 3
replicas, each node a supervised process of the stack (restarted like any other, from its
nodes.conf and append-only file, so a restarted node rejoins with its data).

The cluster's directory is wiped at every start: each `make up` creates a fresh cluster
(an external cluster, REDIS_CLUSTER_NODES, keeps its data). Ports CLUSTER_BASE_PORT.. +5,
their cluster bus ports +10000.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from llm_common.redis_acl import ADMIN_USER
from llm_stack.process import ProcessSpec
from llm_stack.redis_users import StackRedisUsers
from llm_testing.redis_cluster_local import cli_binary, server_binary

CLUSTER_BASE_PORT = 7000
NODES = 6  # 3 masters + 3 replicas
CREATE_TIMEOUT_S = 30.0


def cluster_ports(base: int = CLUSTER_BASE_PORT) -> list[int]:
    return [base + i for i in range(NODES)]


def cluster_url(ports: list[int]) -> str:
    """The redis+cluster:// URL the services get as REDIS_URL."""
    return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports)


def node_specs(
    run_dir: Path, ports: list[int], env: dict[str, str], users: StackRedisUsers | None = None
) -> list[ProcessSpec]:
    """One redis-server per port, cluster-enabled, AOF fsynced every second (a fresh
    directory: the previous run's cluster is discarded). With `users`, every node loads the
    stack's ACL file and replicates as `admin` (from a 0600 file: no password in argv)."""
    root = run_dir / "redis-cluster"
    shutil.rmtree(root, ignore_errors=True)
    binary = str(server_binary())
    specs = []
    for port in ports:
        data = root / str(port)
        data.mkdir(parents=True, exist_ok=True)
        conf = [] if users is None else [str(_auth_conf(data, users))]
        argv = [
            binary, *conf, "--port", str(port), "--bind", "127.0.0.1", "--protected-mode", "yes",
            "--dir", str(data), "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "2000",
            "--appendonly", "yes", "--appendfsync", "everysec", "--save", "",
            "--repl-diskless-sync-delay", "0",  # a new replica syncs at once (WAIT 1 waits on it)
            "--daemonize", "no",
        ]  # fmt: skip
        specs.append(
            ProcessSpec(
                name=f"redis-{port}",
                argv=argv,
                env=env,
                cwd=data,
                log=run_dir / "logs" / f"redis-{port}.log",
                grace_s=10.0,
            )
        )
    return specs


def _auth_conf(data: Path, users: StackRedisUsers) -> Path:
    """The node's configuration file with the ACL file and the replication credentials."""
    if users.admin_password is None:
        raise ValueError("a local cluster with users needs the admin user")
    path = data / "auth.conf"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(f"aclfile {users.acl_path}\nmasteruser {ADMIN_USER}\n")
        f.write(f"masterauth {users.admin_password}\n")
    return path


def create(ports: list[int], users: StackRedisUsers | None = None) -> None:
    """Join the nodes: `redis-cli --cluster create ... --cluster-replicas 1` (as `admin`, its
    password in the environment, when the nodes have users)."""
    cli = cli_binary(server_binary())
    if cli is None:
        raise RuntimeError("REDIS_CLUSTER=1 needs redis-cli (apt install redis-tools)")
    argv = [str(cli), "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports)]
    argv += ["--cluster-replicas", "1", "--cluster-yes"]
    env = dict(os.environ)
    if users is not None and users.admin_password is not None:
        argv += ["--user", ADMIN_USER]
        env["REDISCLI_AUTH"] = users.admin_password
    done = subprocess.run(argv, capture_output=True, text=True, timeout=CREATE_TIMEOUT_S, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout[-300:]}")
