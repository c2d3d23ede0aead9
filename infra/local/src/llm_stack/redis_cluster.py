"""`make up REDIS_CLUSTER=1`: the stack's Redis as a local Redis Cluster, 3 masters + 3
replicas, each node a supervised process of the stack (restarted like any other, from its
nodes.conf and append-only file, so a restarted node rejoins with its data).

The cluster's directory is wiped at every start: each `make up` creates a fresh cluster
(an external cluster, REDIS_CLUSTER_NODES, keeps its data). Ports CLUSTER_BASE_PORT.. +5,
their cluster bus ports +10000.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from llm_stack.process import ProcessSpec
from llm_testing.redis_cluster_local import cli_binary, server_binary

CLUSTER_BASE_PORT = 7000
NODES = 6  # 3 masters + 3 replicas
CREATE_TIMEOUT_S = 30.0


def cluster_ports(base: int = CLUSTER_BASE_PORT) -> list[int]:
    return [base + i for i in range(NODES)]


def cluster_url(ports: list[int]) -> str:
    """The redis+cluster:// URL the services get as REDIS_URL."""
    return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in ports)


def node_specs(run_dir: Path, ports: list[int], env: dict[str, str]) -> list[ProcessSpec]:
    """One redis-server per port, cluster-enabled, AOF fsynced every second (a fresh
    directory: the previous run's cluster is discarded)."""
    root = run_dir / "redis-cluster"
    shutil.rmtree(root, ignore_errors=True)
    binary = str(server_binary())
    specs = []
    for port in ports:
        data = root / str(port)
        data.mkdir(parents=True, exist_ok=True)
        argv = [
            binary, "--port", str(port), "--bind", "127.0.0.1", "--protected-mode", "yes",
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


def create(ports: list[int]) -> None:
    """Join the nodes: `redis-cli --cluster create ... --cluster-replicas 1`."""
    cli = cli_binary(server_binary())
    if cli is None:
        raise RuntimeError("REDIS_CLUSTER=1 needs redis-cli (apt install redis-tools)")
    argv = [str(cli), "--cluster", "create", *(f"127.0.0.1:{p}" for p in ports)]
    argv += ["--cluster-replicas", "1", "--cluster-yes"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=CREATE_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"redis-cli --cluster create failed: {done.stdout[-300:]}")
