"""`mesh-show` and `mesh-status`: the policy next to what Envoy runs, and the mesh's health
from Envoy's own counters."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import yaml

from llm_envoy import live
from llm_envoy.policy_model import MeshPolicy

Config = dict[str, Any]


def policy_dict(policy: MeshPolicy) -> Config:
    """The effective policy in policy.yaml's shape (defaults filled in)."""
    data: Config = _plain(policy)
    data["clusters"] = {"defaults": data.pop("cluster_defaults"), **data.pop("clusters")}
    return {"version": 1, **data}


def _plain(value: Any) -> Any:
    """Dataclasses, mappings (read-only ones too) and tuples as YAML-ready values."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def live_cluster(cluster: Config) -> Config:
    """A running cluster's policy-controlled values, in Envoy's own terms."""
    thresholds = cluster.get("circuit_breakers", {}).get("thresholds", [{}])[0]
    outlier = cluster.get("outlier_detection", {})
    budget = thresholds.get("retry_budget", {})
    return {
        "connect_timeout": cluster.get("connect_timeout"),
        "max_connections": thresholds.get("max_connections"),
        "max_pending_requests": thresholds.get("max_pending_requests"),
        "max_requests": thresholds.get("max_requests"),
        "max_retries": thresholds.get("max_retries"),
        "retry_budget_percent": budget.get("budget_percent", {}).get("value"),
        "consecutive_gateway_failure": outlier.get("consecutive_gateway_failure"),
        "base_ejection_time": outlier.get("base_ejection_time"),
        "max_ejection_percent": outlier.get("max_ejection_percent"),
    }


def live_route(route: Config) -> Config:
    action = route.get("route", {})
    retry = action.get("retry_policy", {})
    return {
        "cluster": action.get("cluster"),
        "timeout": action.get("timeout"),
        "idle_timeout": action.get("idle_timeout"),
        "retry_on": retry.get("retry_on"),
        "num_retries": retry.get("num_retries"),
        "per_try_timeout": retry.get("per_try_timeout"),
        "backoff": retry.get("retry_back_off"),
    }


def live_values(admin: str) -> Config:
    """Clusters and routes as the running Envoy holds them (admin `/config_dump`)."""
    dump = live.config_dump(admin)
    clusters = {n: live_cluster(c) for n, c in sorted(live.active_clusters(dump).items())}
    routes = {
        table: {name: live_route(r) for name, r in table_routes.items() if "route" in r}
        for table, table_routes in sorted(live.active_routes(dump).items())
    }
    return {"clusters": clusters, "routes": routes}


def show_text(policy: MeshPolicy, admin: str) -> str:
    return yaml.safe_dump(
        {"effective_policy": policy_dict(policy), "live": live_values(admin)},
        sort_keys=False,
        width=100,
    )


# The counters behind `mesh-status`: per cluster, what an operator checks first.
_CLUSTER_STATS = {
    "breaker_open": "circuit_breakers.default.rq_open",
    "remaining_rq": "circuit_breakers.default.remaining_rq",
    "overflow_active": "upstream_rq_active_overflow",
    "overflow_pending": "upstream_rq_pending_overflow",
    "overflow_cx": "upstream_cx_overflow",
    "retries": "upstream_rq_retry",
    "retry_ok": "upstream_rq_retry_success",
    "budget_exhausted": "upstream_rq_retry_overflow",
    "retry_limit": "upstream_rq_retry_limit_exceeded",
    "ejected": "outlier_detection.ejections_active",
    "ejections": "outlier_detection.ejections_enforced_total",
    "healthy": "membership_healthy",
    "hosts": "membership_total",
    "rq": "upstream_rq_completed",
}


def cluster_status(admin: str) -> dict[str, dict[str, int]]:
    found = live.stats(admin, r"^cluster\.")
    table: dict[str, dict[str, int]] = {}
    for name, value in found.items():
        cluster, _, rest = name[len("cluster.") :].partition(".")
        for column, suffix in _CLUSTER_STATS.items():
            if rest == suffix and value.lstrip("-").isdigit():
                table.setdefault(cluster, {})[column] = int(value)
    return table


def route_latency(admin: str) -> dict[str, str]:
    """Per-route upstream latency percentiles (route `stat_prefix`es)."""
    found = live.stats(admin, r"^vhost\..*\.route\..*upstream_rq_time$")
    return {name.split(".route.")[1].rsplit(".", 1)[0]: value for name, value in found.items()}


def status_text(admin: str) -> str:
    table = cluster_status(admin)
    columns = list(_CLUSTER_STATS)
    lines = ["cluster".ljust(20) + " ".join(c[:10].rjust(10) for c in columns)]
    for cluster in sorted(table):
        row = table[cluster]
        lines.append(cluster.ljust(20) + " ".join(str(row.get(c, "-")).rjust(10) for c in columns))
    latency = route_latency(admin)
    if latency:
        lines += ["", "route upstream latency (ms): P0 P25 P50 P75 P90 P95 P99 P99.5 P99.9 P100"]
        lines += [f"{route.ljust(40)} {value[:120]}" for route, value in sorted(latency.items())]
    return "\n".join(lines)
