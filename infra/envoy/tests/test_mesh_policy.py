"""policy.yaml: its defaults render exactly the configs the renderer produced before the
policy existed, every key reaches the rendered config, and a bad policy is refused with a
message that names the key and what is allowed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_envoy import bootstrap, layouts
from llm_envoy.policy import DEFAULT_POLICY_FILE, PolicyError, load_policy, parse_policy
from llm_envoy.policy_model import MeshPolicy
from llm_envoy.topology import AUTH_EDGE_PORT, AUTH_HTTP_PORT, SERVICES, Endpoint
from llm_envoy.validate import validate

Config = dict[str, Any]
# sha256 of each config (JSON, sorted keys) as rendered by the commit before the policy
# (add5cc2), i.e. with the tunables hard-coded in Python.
BEFORE_POLICY = json.loads((Path(__file__).parent / "before_policy.json").read_text())


def _digest(config: Config) -> str:
    """Of the config without the routes' stat_prefix, added with the policy (per-route
    stats); everything else must be unchanged."""
    text = json.dumps(_without_route_stats(config), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _without_route_stats(value: Any) -> Any:
    if isinstance(value, list):
        return [_without_route_stats(v) for v in value]
    if not isinstance(value, dict):
        return value
    is_route = "match" in value
    return {
        k: _without_route_stats(v)
        for k, v in value.items()
        if not (is_route and k == "stat_prefix")
    }


def _rendered(policy: MeshPolicy) -> dict[str, str]:
    ports = {
        "main-port": layouts.LocalPorts(),
        "auth-listeners": layouts.LocalPorts(auth_edge=AUTH_EDGE_PORT, auth_http=AUTH_HTTP_PORT),
    }
    otlps = {"plain": None, "traced": Endpoint("127.0.0.1", 4317)}
    found = {}
    for pname, port in ports.items():
        for oname, otlp in otlps.items():
            layout = layouts.local_layout(port, otlp=otlp, policy=policy)
            found[f"local/{pname}/{oname}"] = _digest(bootstrap.local_config(layout))
    edge = layouts.k8s_edge_layout(policy=policy)
    found["k8s/edge"] = _digest(bootstrap.k8s_edge_config(edge))
    for s in SERVICES:
        found[f"k8s/sidecar-{s}"] = _digest(bootstrap.k8s_sidecar_config(s, policy=policy))
    return found


def test_the_committed_policy_is_the_default() -> None:
    assert load_policy(DEFAULT_POLICY_FILE) == MeshPolicy()


def test_default_policy_renders_todays_configs() -> None:
    assert _rendered(load_policy(DEFAULT_POLICY_FILE)) == BEFORE_POLICY


def _with(change: str) -> MeshPolicy:
    data = yaml.safe_load(DEFAULT_POLICY_FILE.read_text())
    overlay = yaml.safe_load(change)
    return parse_policy(_merge(data, overlay))


def _merge(base: Any, over: Any) -> Any:
    if isinstance(base, dict) and isinstance(over, dict):
        merged = dict(base)
        for key, value in over.items():
            merged[key] = _merge(base[key], value) if key in base else value
        return merged
    return over


def _local(policy: MeshPolicy) -> Config:
    ports = layouts.LocalPorts(auth_edge=AUTH_EDGE_PORT, auth_http=AUTH_HTTP_PORT)
    return bootstrap.local_config(layouts.local_layout(ports, policy=policy))


def _cluster(config: Config, name: str) -> Config:
    found: Config = next(c for c in config["static_resources"]["clusters"] if c["name"] == name)
    return found


def _route(config: Config, listener: str, name: str) -> Config:
    for lis in config["static_resources"]["listeners"]:
        if lis["name"] == listener:
            hcm = lis["filter_chains"][0]["filters"][0]["typed_config"]
            routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
            found: Config = next(r for r in routes if r["name"] == name)
            return found
    raise KeyError(listener)


def _edge_filter(config: Config, name: str) -> Config:
    lis = config["static_resources"]["listeners"][0]
    hcm = lis["filter_chains"][0]["filters"][0]["typed_config"]
    found: Config = next(f for f in hcm["http_filters"] if f["name"] == name)["typed_config"]
    return found


def test_cluster_overrides_apply_to_that_cluster_only() -> None:
    policy = _with(
        "clusters: {inference: {circuit_breakers: {max_requests: 7, retry_budget_percent: 35}}}"
    )
    config = _local(policy)
    threshold = _cluster(config, "inference")["circuit_breakers"]["thresholds"][0]
    assert threshold["max_requests"] == 7
    assert threshold["retry_budget"]["budget_percent"]["value"] == 35.0
    assert threshold["max_connections"] == 1024  # the rest from defaults
    other = _cluster(config, "cache")["circuit_breakers"]["thresholds"][0]
    assert other["max_requests"] == 1024


def test_route_classes_and_retries_reach_the_routes() -> None:
    policy = _with(
        """
        edge_routes:
          unary: {timeout_s: 9, per_try_timeout_s: 3, retry: {num_retries: 4, backoff_max_s: 2}}
          streaming: {idle_timeout_s: 30}
        mesh_routes:
          services: {cache: {timeout_s: 0.8, per_try_timeout_s: 0.2}}
        """
    )
    config = _local(policy)
    unary = _route(config, "edge_http", "CountTokens")["route"]
    assert unary["timeout"] == "9s"
    assert unary["retry_policy"]["per_try_timeout"] == "3s"
    assert unary["retry_policy"]["num_retries"] == 4
    assert unary["retry_policy"]["retry_back_off"]["max_interval"] == "2s"
    assert _route(config, "edge_http", "ChatStream")["route"]["idle_timeout"] == "30s"
    cache = _route(config, "mesh_outbound", "cache")["route"]
    assert cache["timeout"] == "0.8s"
    assert cache["retry_policy"]["per_try_timeout"] == "0.2s"


def test_edge_filters_follow_the_policy() -> None:
    policy = _with(
        """
        edge:
          ext_authz: {timeout_s: 0.3, status_on_error: 403}
          rate_limit: {timeout_s: 0.1, failure_mode_deny: true}
          local_rate_limit: {max_tokens: 50, tokens_per_fill: 10, fill_interval_s: 1}
          limits: {max_request_body_bytes: 65536, listener_buffer_limit_bytes: 262144}
        """
    )
    config = _local(policy)
    authz = _edge_filter(config, "envoy.filters.http.ext_authz")
    assert authz["http_service"]["server_uri"]["timeout"] == "0.3s"
    assert authz["status_on_error"] == {"code": "Forbidden"}
    limit = _edge_filter(config, "envoy.filters.http.ratelimit")
    assert (limit["timeout"], limit["failure_mode_deny"]) == ("0.1s", True)
    bucket = _edge_filter(config, "envoy.filters.http.local_ratelimit")
    assert bucket["token_bucket"]["max_tokens"] == 50
    transcoder = _edge_filter(config, "envoy.filters.http.grpc_json_transcoder")
    assert transcoder["max_request_body_size"] == 65536
    assert config["static_resources"]["listeners"][0]["per_connection_buffer_limit_bytes"] == 262144


def test_a_changed_policy_still_validates(envoy_workdir: Path) -> None:
    """Every optional key set at once: Envoy 1.40 accepts the result."""
    policy = _with(
        """
        clusters:
          defaults: {buffer_limit_bytes: 1048576, circuit_breakers: {max_retries: 5}}
          inference: {outlier_detection: {consecutive_gateway_failure: 5}}
        edge:
          local_rate_limit: {max_tokens: 50, tokens_per_fill: 10, fill_interval_s: 1}
          limits: {max_request_body_bytes: 65536, max_response_body_bytes: 1048576,
                   listener_buffer_limit_bytes: 262144}
        """
    )
    path = envoy_workdir / "changed-policy.yaml"
    path.write_text(bootstrap.to_yaml(_local(policy), "policy test"), encoding="utf-8")
    verdict = validate(path, envoy_workdir)
    assert verdict.ok, verdict.output[-3000:]


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ("edge_routes: {unary: {timeuot_s: 3}}", "edge_routes.unary.timeuot_s: unknown key"),
        ("bogus: 1", "bogus: unknown key"),
        ("clusters: {nosuch: {}}", "clusters.nosuch: unknown cluster"),
        (
            "edge_routes: {unary: {timeout_s: -1}}",
            "edge_routes.unary.timeout_s: -1 is out of range (allowed: 0.01 to 3600 seconds)",
        ),
        (
            "clusters: {defaults: {circuit_breakers: {retry_budget_percent: 150}}}",
            "clusters.defaults.circuit_breakers.retry_budget_percent: 150 is out of range "
            "(allowed: 0 to 100 %)",
        ),
        (
            "edge_routes: {unary: {retry: {retry_on: [unavailable, sometimes]}}}",
            "edge_routes.unary.retry.retry_on: sometimes not allowed",
        ),
        ("edge: {ext_authz: {failure_mode_allow: 1}}", "expected true or false"),
        ("edge: {ext_authz: {status_on_error: 418}}", "418 not allowed (allowed: 401"),
        ("mesh_routes: {services: {inference: {timeout_s: 1}}}", "unknown service"),
        (
            "edge_routes: {unary: {retry: {backoff_base_s: 1, backoff_max_s: 0.5}}}",
            "backoff_max_s: 0.5 is below backoff_base_s 1",
        ),
        (
            "mesh_routes: {services: {cache: {per_try_timeout_s: 5}}}",
            "mesh_routes.services.cache.per_try_timeout_s: 5 exceeds timeout_s 1.5",
        ),
        ("clusters: {defaults: {circuit_breakers: {max_requests: 1.5}}}", "expected an integer"),
        ("version: 2", "version: 2 is not supported"),
    ],
)
def test_invalid_policies_are_refused_naming_the_key(change: str, expected: str) -> None:
    with pytest.raises(PolicyError) as refused:
        _with(change)
    assert any(expected in p for p in refused.value.problems), refused.value.problems


def test_every_problem_is_reported_at_once() -> None:
    with pytest.raises(PolicyError) as refused:
        _with("edge_routes: {unary: {timeout_s: -1, nope: 2}}\nbogus: 1")
    assert len(refused.value.problems) == 3


def test_a_file_that_is_not_yaml_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("clusters: [unclosed\n", encoding="utf-8")
    with pytest.raises(PolicyError, match="not YAML"):
        load_policy(path)
