"""Issue 32, finding 7 (Envoy's admin), on a real Envoy with the rendered local config: the
admin listens only on a unix socket only Envoy's user may open; the loopback port where it
was serves reads only (what mesh-show/status/apply, probes and Prometheus use), and neither it
nor the edge lets anyone stop, drain, fail or reconfigure Envoy or dump its config from the
edge. The Kubernetes flavour's listeners are checked on the rendered configs."""

from __future__ import annotations

import asyncio
import stat
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import yaml

from llm_envoy import bootstrap, layouts
from llm_envoy.admin_access import (
    ADMIN_SOCKET,
    K8S_ADMIN_DIR,
    K8S_ADMIN_SOCKET,
    READ_ONLY_PATHS,
)
from llm_envoy.testing import RunningEdge, http_status, running_edge, socket_request
from llm_envoy.topology import SERVICES

from .conftest import PROTOS, REPO

pytestmark = [
    pytest.mark.integration,
    pytest.mark.security,
    pytest.mark.asyncio(loop_scope="module"),
]

DANGEROUS = (
    "/quitquitquit",
    "/drain_listeners",
    "/healthcheck/fail",
    "/logging?level=trace",
    "/runtime_modify?edge.body_limit_413=1",
    "/reset_counters",
    "/cpuprofiler?enable=y",
    "/heapprofiler?enable=y",
)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def edge(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[RunningEdge]:
    async with running_edge(tmp_path_factory.mktemp("admin"), PROTOS, auth=None) as envoy:
        yield envoy


def _healthz(edge: RunningEdge) -> int:
    return http_status(edge.edge_http, "GET", "/healthz")


async def test_admin_is_a_private_unix_socket(edge: RunningEdge) -> None:
    path = edge.workdir / ADMIN_SOCKET
    mode = path.stat().st_mode
    assert stat.S_ISSOCK(mode)
    assert stat.S_IMODE(mode) == 0o600
    # The operator's way in: the socket does what the admin does (and undoes it).
    assert await asyncio.to_thread(socket_request, path, "GET", "/ready") == (200, b"LIVE\n")
    assert (await asyncio.to_thread(socket_request, path, "POST", "/healthcheck/fail"))[0] == 200
    assert await asyncio.to_thread(_healthz, edge) == 503
    assert (await asyncio.to_thread(socket_request, path, "POST", "/healthcheck/ok"))[0] == 200
    assert await asyncio.to_thread(_healthz, edge) == 200


async def test_loopback_admin_port_serves_reads_only(edge: RunningEdge) -> None:
    for path in READ_ONLY_PATHS:
        assert await asyncio.to_thread(http_status, edge.admin, "GET", path) == 200, path
    assert await asyncio.to_thread(http_status, edge.admin, "GET", "/stats?filter=^server") == 200
    for path in (*DANGEROUS, "/certs", "/listeners"):
        for method in ("POST", "GET"):
            status = await asyncio.to_thread(http_status, edge.admin, method, path)
            assert status == 404, (method, path)
    for method in ("POST", "PUT", "DELETE"):
        assert await asyncio.to_thread(http_status, edge.admin, method, "/stats") == 404
    await _still_serving(edge)


async def test_edge_reaches_no_admin_endpoint(edge: RunningEdge) -> None:
    for path in (*DANGEROUS, *READ_ONLY_PATHS):
        for method in ("POST", "GET"):
            for host in (None, edge.admin, "localhost:9901"):
                status = await asyncio.to_thread(http_status, edge.edge_http, method, path, host)
                # No auth here: ext_authz fails closed (503) where the catch-all would say
                # 404. Never the admin's answer.
                assert status in (404, 503), (method, path, host)
    await _still_serving(edge)


async def _still_serving(edge: RunningEdge) -> None:
    assert edge.process.poll() is None
    assert await asyncio.to_thread(_healthz, edge) == 200  # not failed, not draining
    status, body = await asyncio.to_thread(
        socket_request, edge.workdir / ADMIN_SOCKET, "GET", "/ready"
    )
    assert (status, body) == (200, b"LIVE\n")


def _stats_routes(config: dict[str, Any]) -> list[dict[str, Any]]:
    (listener,) = [x for x in config["static_resources"]["listeners"] if x["name"] == "stats"]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    routes: list[dict[str, Any]] = hcm["route_config"]["virtual_hosts"][0]["routes"]
    return routes


@pytest.mark.parametrize("service", ["router", "auth", "inference"])
async def test_kubernetes_sidecars_keep_the_admin_off_the_pod_network(service: str) -> None:
    config = bootstrap.k8s_sidecar_config(service)
    assert config["admin"]["address"] == {"pipe": {"path": K8S_ADMIN_SOCKET, "mode": 0o600}}
    routes = _stats_routes(config)
    exposed = {r["match"]["path"] for r in routes if "path" in r["match"]}
    assert exposed == {"/stats/prometheus", "/ready"}
    assert all(r["match"]["headers"][0]["name"] == ":method" for r in routes if "route" in r)
    assert routes[-1]["direct_response"]["status"] == 404


async def test_kubernetes_gateway_admin_is_on_loopback_with_a_read_only_stats_port() -> None:
    config = bootstrap.k8s_edge_config(layouts.k8s_edge_layout())
    assert config["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
    exposed = {r["match"]["path"] for r in _stats_routes(config) if "path" in r["match"]}
    assert exposed == {"/stats/prometheus", "/ready"}


@pytest.mark.parametrize("service", sorted(SERVICES))
async def test_kubernetes_admin_socket_is_mounted_into_envoy_only(service: str) -> None:
    path = REPO / "infra" / "k8s" / "base" / f"{service}.yaml"
    pod = next(
        d["spec"]["template"]["spec"]
        for d in yaml.safe_load_all(path.read_text())
        if d and d.get("kind") in ("Deployment", "StatefulSet")
    )
    (sidecar,) = pod["initContainers"]
    assert {"name": "envoy-admin", "mountPath": K8S_ADMIN_DIR} in sidecar["volumeMounts"]
    for app in pod["containers"]:
        assert all(m["name"] != "envoy-admin" for m in app.get("volumeMounts", []))
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes["envoy-admin"]
