"""Readiness probes: gRPC health, Envoy's admin (/ready, cluster health) and Redis PING."""

from __future__ import annotations

import contextlib
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import grpc
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from redis.exceptions import RedisClusterException

from llm_common.config import ConfigError
from llm_common.redis_conn import open_sync_client
from llm_common.server_tls import ServerTls

POLL_S = 0.2


class NotReadyError(RuntimeError):
    """A component did not become ready in time, or exited."""


def grpc_serving(
    target: str, service: str = "", timeout_s: float = 1.0, tls: ServerTls | None = None
) -> bool:
    """Whether `target` answers SERVING for `service` (with `tls`: presenting that mesh
    certificate, MESH_MTLS=1)."""
    if tls is None:
        opened = grpc.insecure_channel(target)
    else:
        opened = grpc.secure_channel(target, tls.channel_credentials())
    with opened as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def http_get(url: str, timeout_s: float = 1.0) -> tuple[int, str]:
    """Status and body of a GET (status 0 when nothing answered)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return int(response.status), response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return int(err.code), err.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError):
        return 0, ""


def envoy_ready(admin: str) -> bool:
    status, body = http_get(f"http://{admin}/ready")
    return status == 200 and body.strip() == "LIVE"


def unhealthy_hosts(admin: str, clusters: set[str]) -> list[str]:
    """`cluster/host` of every host in `clusters` that Envoy does not (yet) count as healthy."""
    status, body = http_get(f"http://{admin}/clusters")
    if status != 200:
        return [f"{name}/?" for name in sorted(clusters)]
    seen: set[str] = set()
    bad = []
    for line in body.splitlines():
        parts = line.split("::")
        if len(parts) == 4 and parts[0] in clusters and parts[2] == "health_flags":
            seen.add(parts[0])
            if parts[3] != "healthy":
                bad.append(f"{parts[0]}/{parts[1]}={parts[3]}")
    bad.extend(f"{name}/?" for name in sorted(clusters - seen))
    return bad


def redis_ready(url: str) -> bool:
    try:
        client = open_sync_client(url, timeout_s=0.5)
        with contextlib.closing(client):
            return bool(client.ping())
    except (redis.RedisError, RedisClusterException, OSError, ValueError, ConfigError):
        return False


def wait_until(
    what: str, check: Callable[[], bool], timeout_s: float, failed: Callable[[], str | None]
) -> None:
    """Poll `check` until true; NotReadyError on timeout or as soon as `failed` names a reason."""
    deadline = time.monotonic() + timeout_s
    while True:
        if check():
            return
        reason = failed()
        if reason is not None:
            raise NotReadyError(f"{what}: {reason}")
        if time.monotonic() > deadline:
            raise NotReadyError(f"{what}: not ready after {timeout_s:.0f} s")
        time.sleep(POLL_S)  # polling other processes: there is no event to wait on
