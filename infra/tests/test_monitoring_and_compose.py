"""Prometheus, alert rules, the Grafana dashboard and the compose file agree with the stack."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_envoy.topology import ADMIN_PORT, MESH_OUTBOUND_PORT, SERVICES
from llm_stack.catalogue import local_replicas
from llm_stack.config import StackPorts, metrics_port_for

REPO = Path(__file__).resolve().parents[2]
PROMETHEUS = REPO / "infra" / "prometheus"
CATALOGUE = REPO / "infra" / "config" / "models.yaml"


def load(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def test_local_scrape_config_covers_every_process() -> None:
    config = load(PROMETHEUS / "prometheus.yml")
    targets = {
        job["job_name"]: [t for s in job["static_configs"] for t in s["targets"]]
        for job in config["scrape_configs"]
    }
    for name, info in SERVICES.items():
        if name != "inference":
            assert targets[name] == [f"127.0.0.1:{info.metrics_port}"]
    replicas = [f"127.0.0.1:{metrics_port_for(r.port)}" for r in local_replicas(CATALOGUE)]
    assert targets["inference"] == replicas
    assert targets["envoy"] == [f"127.0.0.1:{ADMIN_PORT}"]
    for rules in config["rule_files"]:
        assert (PROMETHEUS / rules).is_file()


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in load(PROMETHEUS / "alerts.yml")["groups"] for rule in group["rules"]]


def test_alerts_cover_errors_latency_breakers_and_budgets() -> None:
    rules = alert_rules()
    names = {r["alert"] for r in rules}
    assert {
        "LLMHighErrorRate",
        "LLMTimeToFirstTokenP99High",
        "LLMCircuitBreakerOpen",
        "LLMBudgetExhausted",
    } <= names
    for rule in rules:
        assert rule["labels"]["severity"] in {"page", "warn", "info"}
        assert rule["annotations"]["summary"]
        expr = rule["expr"]
        assert expr.count("(") == expr.count(")"), rule["alert"]
        assert expr.count("{") == expr.count("}"), rule["alert"]


def test_kubernetes_scrape_config_and_adapter_rules_load() -> None:
    k8s = load(PROMETHEUS / "prometheus-k8s.yml")
    assert {j["job_name"] for j in k8s["scrape_configs"]} == {"llm-services", "envoy-sidecars"}
    # The HPA's two signals: queue depth and KV-cache usage.
    queue, kv_usage = load(PROMETHEUS / "adapter-rules.yaml")["rules"]
    assert queue["seriesQuery"].startswith("vllm:num_requests_waiting")
    assert queue["name"]["as"] == "llm_inference_queue_depth"
    assert kv_usage["seriesQuery"].startswith("vllm:kv_cache_usage_perc")
    assert kv_usage["name"]["as"] == "llm_inference_kv_cache_usage"


def test_dashboard_panels() -> None:
    dashboard = json.loads((REPO / "infra" / "grafana" / "llm-platform.json").read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    titles = " | ".join(p["title"].lower() for p in panels)
    for topic in (
        "time to first token",
        "time per output token",
        "tokens/s",
        "cache hit rate",
        "breaker",
        "queue depth",
        "spend",
    ):
        assert topic in titles, topic
    for panel in panels:
        assert panel["datasource"]["uid"] == "${datasource}"
        for target in panel["targets"]:
            assert target["expr"].count("(") == target["expr"].count(")"), panel["title"]


def compose() -> dict[str, Any]:
    return dict(load(REPO / "infra" / "compose.yaml")["services"])


def environment(service: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in service["environment"].items()}


@pytest.mark.parametrize("name", [n for n in SERVICES if n != "inference"])
def test_compose_services_use_the_default_ports(name: str) -> None:
    service = compose()[name]
    env = environment(service)
    assert env["GRPC_PORT"] == str(SERVICES[name].grpc_port)
    assert env["METRICS_PORT"] == str(SERVICES[name].metrics_port)
    assert service["network_mode"] == "host"
    assert service["healthcheck"]["test"][0] == "CMD"


def test_compose_runs_one_container_per_catalogue_replica() -> None:
    inference = {n: s for n, s in compose().items() if n.startswith("inference")}
    bound = {
        int(environment(s)["GRPC_PORT"]): environment(s)["INFERENCE_MODEL"]
        for s in inference.values()
    }
    assert bound == {r.port: r.model for r in local_replicas(CATALOGUE)}
    for service in inference.values():
        env = environment(service)
        assert env["METRICS_PORT"] == str(metrics_port_for(int(env["GRPC_PORT"])))


def test_compose_router_uses_the_mesh() -> None:
    env = environment(compose()["router"])
    mesh = f"127.0.0.1:{MESH_OUTBOUND_PORT}"
    for variable in (
        "TOKENIZER_SERVICE_ADDR",
        "CACHE_SERVICE_ADDR",
        "BILLING_SERVICE_ADDR",
        "AUTH_SERVICE_ADDR",
        "INFERENCE_MESH_ADDR",
    ):
        assert env[variable] == mesh


def test_compose_auth_serves_the_listeners_the_rendered_envoy_calls() -> None:
    # `prepare` renders the one-host config with the default plan: auth's edge and HTTP
    # ext_authz listeners must be where that config points.
    env = environment(compose()["auth"])
    ports = StackPorts().envoy
    assert env["AUTH_EDGE_PORT"] == str(ports.auth_edge)
    assert env["AUTH_HTTP_AUTHZ_PORT"] == str(ports.auth_http)
