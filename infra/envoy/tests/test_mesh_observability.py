"""The mesh dashboard and `mesh-status` read stats a real Envoy exports: every metric and
label the Grafana panels query exists in `/stats/prometheus` of the rendered config after a
call through the edge, Prometheus scrapes that endpoint, and `status` reports the cluster's
health and the route's latency."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from concurrent import futures
from dataclasses import replace

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from llm_envoy import live, mesh_view
from llm_envoy.layouts import LocalPorts
from llm_envoy.local_spec import LocalSpec
from llm_envoy.policy import load_policy
from llm_envoy.render import render_local_spec
from llm_envoy.topology import LLM_SERVICE
from llm_envoy.validate import envoy_binary

from .conftest import PROTOS, REPO
from .test_mesh_apply import _free_port, _wait_ready

DASHBOARD = REPO / "infra" / "grafana" / "llm-mesh.json"
PROMETHEUS = REPO / "infra" / "prometheus" / "prometheus.yml"
PROMETHEUS_K8S = REPO / "infra" / "prometheus" / "prometheus-k8s.yml"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """A router stand-in (gRPC health, SERVING) behind a real Envoy; one call through the
    edge; then Envoy's Prometheus text and its admin address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    servicer.set(LLM_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    router_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    workdir = tmp_path_factory.mktemp("observed")
    from llm_envoy.certs import ensure_dev_pki

    ensure_dev_pki(workdir / "certs", mesh_identity="spiffe://llm.local/ns/llm/sa/test")
    base = LocalPorts()
    ports = replace(
        base,
        edge_http=_free_port(),
        edge_tls=_free_port(),
        admin=_free_port(),
        mesh=_free_port(),
        grpc={**base.grpc, "router": router_port},
    )
    spec = LocalSpec(ports)
    boot = render_local_spec(spec, workdir, PROTOS, load_policy())
    args = [str(envoy_binary()), "-c", str(boot), "--disable-hot-restart", "--log-level", "warn"]
    process = subprocess.Popen(
        args, cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
    )
    try:
        _wait_ready(spec.admin, process)
        _call_through_edge(f"127.0.0.1:{ports.edge_http}", spec.admin)
        yield live.stats_text(spec.admin), spec.admin
    finally:
        process.terminate()
        process.wait(10)
        server.stop(None)
        shutil.rmtree(workdir, ignore_errors=True)


def _call_through_edge(edge: str, admin: str) -> None:
    """Health Check through the edge's `health` route, once Envoy sees the router healthy."""
    import time

    deadline = time.monotonic() + 20
    while mesh_view.cluster_status(admin).get("router", {}).get("healthy") != 1:
        assert time.monotonic() < deadline, "router never healthy in Envoy"
        time.sleep(0.2)
    with grpc.insecure_channel(edge) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=LLM_SERVICE), timeout=5)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def _families(text: str) -> dict[str, set[str]]:
    """Metric family -> label names seen on its samples."""
    kinds = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    labels: dict[str, set[str]] = {name: set() for name in kinds}
    for name, body in re.findall(r"^([a-zA-Z_:][\w:]*)\{([^}]*)\}", text, re.M):
        family = re.sub(r"_(bucket|sum|count)$", "", name) if name not in kinds else name
        labels.setdefault(family, set()).update(re.findall(r"(\w+)=", body))
    return labels


def _queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return [t["expr"] for p in dashboard["panels"] for t in p["targets"]]


def test_every_panel_queries_metrics_and_labels_envoy_exports(exported: tuple[str, str]) -> None:
    families = _families(exported[0])
    for expr in _queries():
        grouped = re.findall(r"by \(([^)]*)\)", expr)
        for metric in re.findall(r"\benvoy_[a-z0-9_]+", re.sub(r"by \([^)]*\)", "", expr)):
            family = re.sub(r"_bucket$", "", metric)
            assert family in families, f"{metric} (in {expr}) is not exported"
            for label in {g.strip() for group in grouped for g in group.split(",")} - {"le"}:
                assert label in families[family], f"{metric} has no label {label} ({expr})"


def test_the_panels_cover_what_an_operator_checks() -> None:
    text = " ".join(_queries())
    for needed in (
        "circuit_breakers_default_rq_open",
        "upstream_rq_active_overflow",
        "upstream_rq_retry_overflow",  # retry budget exhausted
        "outlier_detection_ejections_active",
        "membership_healthy",
        "vhost_route_upstream_rq_time_bucket",
    ):
        assert needed in text, needed


def test_prometheus_scrapes_envoy_stats() -> None:
    local = yaml.safe_load(PROMETHEUS.read_text(encoding="utf-8"))
    job = next(j for j in local["scrape_configs"] if j["job_name"] == "envoy")
    assert job["metrics_path"] == "/stats/prometheus"
    k8s = PROMETHEUS_K8S.read_text(encoding="utf-8")
    assert "envoy-stats" in k8s  # every Envoy container's stats port, gateway included
    gateway = (REPO / "infra" / "k8s" / "base" / "gateway.yaml").read_text(encoding="utf-8")
    assert "name: envoy-stats" in gateway


def test_status_reports_health_and_route_latency(exported: tuple[str, str]) -> None:
    admin = exported[1]
    router = mesh_view.cluster_status(admin)["router"]
    assert (router["healthy"], router["hosts"], router["breaker_open"]) == (1, 1, 0)
    assert router["rq"] >= 1
    assert "health" in mesh_view.route_latency(admin)
    assert "router" in mesh_view.status_text(admin)
