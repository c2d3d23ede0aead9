"""The settings that separate a mesh from a demo (see the Envoy 1.40 notes): stream timeouts,
client deadlines, filter order, fail-closed auth, retries, outlier detection, panic threshold."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from llm_envoy import bootstrap, layouts
from llm_envoy.clusters import REPLICA_CLUSTER
from llm_envoy.filters import AUTHZ_CONTENT_TYPE_HEADER, IDENTITY_HEADERS, NO_RATE_LIMIT_HEADER
from llm_envoy.routes import LLM_METHODS, Kind
from llm_envoy.topology import (
    AUTH_EDGE_HEALTH,
    AUTH_EDGE_PORT,
    AUTH_HTTP_PORT,
    REPLICA_HEADER,
    Endpoint,
)

Config = dict[str, Any]


def configs() -> dict[str, Config]:
    ports = layouts.LocalPorts(auth_edge=AUTH_EDGE_PORT)
    local = layouts.local_layout(ports, otlp=Endpoint("127.0.0.1", 4317))
    found = {"local": bootstrap.local_config(local)}
    # As `make up` runs it: ext_authz on auth's HTTP listener, rate limits on its edge one.
    ports = layouts.LocalPorts(auth_edge=AUTH_EDGE_PORT, auth_http=AUTH_HTTP_PORT)
    found["local-http-authz"] = bootstrap.local_config(layouts.local_layout(ports))
    found["k8s-edge"] = bootstrap.k8s_edge_config(layouts.k8s_edge_layout())
    found["k8s-router"] = bootstrap.k8s_sidecar_config("router")
    found["k8s-billing"] = bootstrap.k8s_sidecar_config("billing")
    return found


CONFIGS = configs()


def hcms(config: Config) -> Iterator[tuple[str, Config]]:
    for listener in config["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for f in chain["filters"]:
                yield listener["name"], f["typed_config"]


def routes(config: Config, listener: str | None = None) -> Iterator[Config]:
    for name, hcm in hcms(config):
        if listener is None or name == listener:
            for vhost in hcm["route_config"]["virtual_hosts"]:
                yield from vhost["routes"]


def clusters(config: Config) -> dict[str, Config]:
    return {c["name"]: c for c in config["static_resources"]["clusters"]}


def by_name(config: Config, listener: str) -> dict[str, Config]:
    return {r["name"]: r for r in routes(config, listener) if "name" in r}


@pytest.mark.parametrize("flavour", ["local", "k8s-edge"])
def test_edge_filter_order(flavour: str) -> None:
    for name, hcm in hcms(CONFIGS[flavour]):
        if not name.startswith("edge"):
            continue
        order = [f["name"].removeprefix("envoy.filters.http.") for f in hcm["http_filters"]]
        # Spoofed identity goes before ext_authz sets it; the rate limiter sees the gRPC route
        # the transcoder produced; the router is last.
        assert order.index("header_mutation") < order.index("ext_authz")
        assert order.index("ext_authz") < order.index("grpc_json_transcoder")
        assert order.index("grpc_json_transcoder") < order.index("ratelimit")
        assert order[-1] == "router"
        mutations = [
            m
            for f in hcm["http_filters"]
            if f["name"] == "envoy.filters.http.header_mutation"
            for m in f["typed_config"]["mutations"]["request_mutations"]
        ]
        removed = {m["remove"] for m in mutations if "remove" in m}
        assert {*IDENTITY_HEADERS, REPLICA_HEADER} <= removed
        copied = {
            m["append"]["header"]["key"]: m["append"]["header"]["value"]
            for m in mutations
            if "append" in m
        }
        assert copied == {AUTHZ_CONTENT_TYPE_HEADER: "%REQ(content-type)%"}


def edge_filter(name: str, flavour: str = "local") -> Config:
    _, hcm = next(hcms(CONFIGS[flavour]))
    return next(f["typed_config"] for f in hcm["http_filters"] if f["name"] == name)


def test_auth_fails_closed_and_rate_limits_fail_open_as_resource_exhausted() -> None:
    authz = edge_filter("envoy.filters.http.ext_authz")
    assert authz["failure_mode_allow"] is False
    limiter = edge_filter("envoy.filters.http.ratelimit")
    assert limiter["rate_limited_as_resource_exhausted"] is True
    assert limiter["failure_mode_deny"] is False
    assert float(limiter["timeout"].removesuffix("s")) >= 0.1  # the 20 ms default is too tight


def test_transcoder_streams_server_sent_events() -> None:
    transcoder = edge_filter("envoy.filters.http.grpc_json_transcoder")
    assert transcoder["print_options"]["stream_sse_style_delimited"] is True
    assert transcoder["convert_grpc_status"] is True


@pytest.mark.parametrize("flavour", list(CONFIGS))
def test_no_route_keeps_the_15_second_default_timeout(flavour: str) -> None:
    for route in routes(CONFIGS[flavour]):
        if "route" in route:
            assert "timeout" in route["route"], route.get("name", route["match"])


def test_streams_and_generations_have_no_route_timeout_but_honour_grpc_timeout() -> None:
    edge = by_name(CONFIGS["local"], "edge_http")
    for method in LLM_METHODS:
        action = edge[method.name]["route"]
        if method.kind is not Kind.UNARY:
            assert action["timeout"] == "0s"
        if method.kind is Kind.STREAM:
            # No Envoy timer: the client's grpc-timeout reaches the router unchanged, which
            # ends the stream with DEADLINE_EXCEEDED instead of Envoy resetting it.
            assert "max_stream_duration" not in action
            continue
        duration = action["max_stream_duration"]
        assert "grpc_timeout_header_max" in duration
        if method.kind is Kind.LONG_UNARY:
            assert "max_stream_duration" in duration
    assert edge["ChatStream"]["route"]["idle_timeout"] == "60s"


@pytest.mark.parametrize("flavour", list(CONFIGS))
def test_no_stream_route_runs_a_stream_timer(flavour: str) -> None:
    # Generate and WatchLoad on the mesh too: a timer there reset Generate at the deadline
    # (read as a replica failure) and cut every WatchLoad stream after 600 s.
    for route in routes(CONFIGS[flavour]):
        path = route["match"].get("path", "")
        if path.endswith(("Stream", "/Generate", "/WatchLoad", "/ExportUsage", "/WatchChanges")):
            assert "max_stream_duration" not in route["route"], path


@pytest.mark.parametrize("flavour", ["local", "k8s-router"])
def test_the_cache_feed_outlives_the_cache_unary_route(flavour: str) -> None:
    # The cache's prefix route has a 1.5 s timeout; WatchChanges streams for the router's
    # whole life, heartbeating every second, and the router reconnects by itself.
    mesh = list(routes(CONFIGS[flavour], "mesh_outbound"))
    names = [r.get("name") for r in mesh]
    feed = mesh[names.index("cache-WatchChanges")]
    assert names.index("cache-WatchChanges") < names.index("cache")
    assert feed["match"] == {"path": "/llmapi.cache.v1.CacheService/WatchChanges"}
    assert feed["route"] == {"cluster": "cache", "timeout": "0s", "idle_timeout": "60s"}


@pytest.mark.parametrize("flavour", ["local", "k8s-router"])
def test_recorded_hits_are_retried_only_when_they_cannot_have_been_counted(flavour: str) -> None:
    mesh = list(routes(CONFIGS[flavour], "mesh_outbound"))
    names = [r.get("name") for r in mesh]
    hits = mesh[names.index("cache-RecordHits")]
    assert names.index("cache-RecordHits") < names.index("cache")
    assert hits["match"] == {"path": "/llmapi.cache.v1.CacheService/RecordHits"}
    retry_on = set(hits["route"]["retry_policy"]["retry_on"].split(","))
    assert retry_on == {"connect-failure", "refused-stream"}
    assert hits["route"]["timeout"] == "1.5s"


def test_generation_is_retried_only_when_it_cannot_have_started() -> None:
    edge = by_name(CONFIGS["local"], "edge_http")
    for name in ("Chat", "ChatStream", "Complete", "CompleteStream", "Embed"):
        retry_on = set(edge[name]["route"]["retry_policy"]["retry_on"].split(","))
        assert retry_on == {"connect-failure", "refused-stream"}


@pytest.mark.parametrize("flavour", list(CONFIGS))
def test_retries_back_off_with_jitter_and_per_try_timeouts_are_retryable(flavour: str) -> None:
    for route in routes(CONFIGS[flavour]):
        policy = route.get("route", {}).get("retry_policy")
        if policy is None:
            continue
        assert policy["retry_back_off"]["base_interval"] == "0.05s"
        assert policy["retry_host_predicate"][0]["name"].endswith("previous_hosts")
        if "per_try_timeout" in policy:
            # A per-try timeout is retried only with reset, 5xx or gateway-error in retry_on.
            assert "reset" in policy["retry_on"].split(",")


def test_the_chosen_replica_path_is_not_retried_by_the_mesh() -> None:
    for flavour in ("local", "k8s-router"):
        replica = [
            r
            for r in routes(CONFIGS[flavour], "mesh_outbound")
            if r["route"]["cluster"] == REPLICA_CLUSTER
        ]
        assert len(replica) == 3
        for route in replica:
            assert "retry_policy" not in route["route"]
            assert route["match"]["headers"] == [{"name": REPLICA_HEADER, "present_match": True}]


@pytest.mark.parametrize("flavour", list(CONFIGS))
def test_health_checked_clusters_eject_and_never_panic(flavour: str) -> None:
    for name, cluster in clusters(CONFIGS[flavour]).items():
        if "health_checks" not in cluster:
            continue
        assert cluster["common_lb_config"]["healthy_panic_threshold"] == {"value": 0}, name
        outlier = cluster["outlier_detection"]
        assert outlier["enforcing_consecutive_gateway_failure"] == 100, name
        assert outlier["successful_active_health_check_uneject_host"] is False, name
        thresholds = cluster["circuit_breakers"]["thresholds"][0]
        assert thresholds["retry_budget"]["budget_percent"]["value"] == 20.0
        (check,) = cluster["health_checks"]
        if name == "auth_http":  # auth's HTTP ext_authz listener answers its own probe
            assert check["http_health_check"] == {"path": "/healthz"}
            continue
        service = check["grpc_health_check"]["service_name"]
        assert service.startswith("llmapi.") or service == AUTH_EDGE_HEALTH, name


def test_local_mesh_reaches_chosen_replicas_by_original_destination() -> None:
    replica = clusters(CONFIGS["local"])[REPLICA_CLUSTER]
    assert replica["type"] == "ORIGINAL_DST"
    assert replica["original_dst_lb_config"]["http_header_name"] == REPLICA_HEADER


def test_kubernetes_mesh_is_mutual_tls_with_spiffe_identities() -> None:
    router_sidecar = CONFIGS["k8s-router"]
    for name in ("tokenizer", "billing", "inference", REPLICA_CLUSTER):
        tls = clusters(router_sidecar)[name]["transport_socket"]["typed_config"]
        (san,) = tls["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"]
        assert san["matcher"]["exact"].startswith("spiffe://llm.local/ns/llm/sa/")
    inbound = next(
        listener
        for listener in CONFIGS["k8s-billing"]["static_resources"]["listeners"]
        if listener["name"] == "mesh_inbound"
    )
    tls = inbound["filter_chains"][0]["transport_socket"]["typed_config"]
    assert tls["require_client_certificate"] is True


def test_billing_admin_surface_is_the_gateway_s_only_and_path_limited() -> None:
    _, hcm = next(h for h in hcms(CONFIGS["k8s-billing"]) if h[0] == "mesh_inbound")
    rbac = hcm["http_filters"][0]["typed_config"]["rules"]["policies"]
    assert rbac["router"]["permissions"] == [{"any": True}]
    prefixes = [
        r["url_path"]["path"]["prefix"]
        for r in rbac["gateway"]["permissions"][0]["or_rules"]["rules"]
    ]
    assert "/llmapi.billing.v1.BillingService/GetUsage" in prefixes
    assert not any(p.endswith(("/Settle", "/Reserve", "/Release")) for p in prefixes)


def test_admin_routes() -> None:
    edge = by_name(CONFIGS["local"], "edge_http")
    create_key = edge["CreateKey"]["typed_per_filter_config"]["envoy.filters.http.ext_authz"]
    assert create_key["disabled"] is True  # auth checks the admin key itself
    usage = edge["GetUsage"]["typed_per_filter_config"]
    assert usage["envoy.filters.http.ext_authz"]["check_settings"]["context_extensions"] == {
        "required_scopes": "admin"
    }
    principal = usage["envoy.filters.http.rbac"]["rbac"]["rules"]["policies"]["admin-tenant"][
        "principals"
    ]
    assert principal == [{"header": {"name": "x-tenant-id", "string_match": {"exact": "system"}}}]
    paths = [r["match"].get("path", "") for r in routes(CONFIGS["local"], "edge_http")]
    assert not any(p.endswith(("/Settle", "/Reserve", "/ReserveTokens")) for p in paths)


@pytest.mark.parametrize("flavour", list(CONFIGS))
def test_admin_interface_is_a_private_socket_or_loopback(flavour: str) -> None:
    address = CONFIGS[flavour]["admin"]["address"]
    if flavour == "k8s-edge":  # the gateway pod holds only Envoy (llm_envoy.admin_access)
        assert address["socket_address"]["address"] == "127.0.0.1"
    else:
        assert address["pipe"]["mode"] == 0o600


def test_openai_paths_go_through_ext_authz_with_scopes_and_rate_limits() -> None:
    edge = by_name(CONFIGS["local"], "edge_http")
    chat = edge["/v1/chat/completions"]
    assert chat["route"]["cluster"] == "router_http"
    context = chat["typed_per_filter_config"]["envoy.filters.http.ext_authz"]["check_settings"]
    assert context["context_extensions"]["required_scopes"] == "completion:write"
    assert chat["route"]["rate_limits"]


def test_the_edge_strips_exactly_the_headers_auth_sets() -> None:
    # Two deployables, one contract: a header auth sets that the edge let clients send could
    # be spoofed, and one the edge strips that auth never sets would be lost.
    from llm_auth import extauthz

    assert IDENTITY_HEADERS == extauthz.IDENTITY_HEADERS
    assert NO_RATE_LIMIT_HEADER == extauthz.NO_RATE_LIMIT_HEADER
    assert AUTHZ_CONTENT_TYPE_HEADER == extauthz.CONTENT_TYPE_HEADER


@pytest.mark.parametrize("flavour", list(CONFIGS))
def test_the_check_request_never_carries_the_grpc_content_type(flavour: str) -> None:
    # With content-type application/grpc on the check, a check that cannot reach auth comes
    # back as Envoy's gRPC-shaped local reply, HTTP 200, which ext_authz took for "allowed".
    authz_filters = [
        f["typed_config"]
        for _, hcm in hcms(CONFIGS[flavour])
        for f in hcm.get("http_filters", [])
        if f["name"] == "envoy.filters.http.ext_authz"
    ]
    for authz in authz_filters:
        allowed = {p["exact"] for p in authz["allowed_headers"]["patterns"]}
        assert "content-type" not in allowed
        assert AUTHZ_CONTENT_TYPE_HEADER in allowed


@pytest.mark.parametrize("flavour", ["local", "k8s-edge"])
def test_rate_limit_descriptors_drop_when_ext_authz_marks_them_unlimited(flavour: str) -> None:
    routes = [r for r in by_name(CONFIGS[flavour], "edge_http").values() if "route" in r]
    limited = [r["route"]["rate_limits"] for r in routes if "rate_limits" in r["route"]]
    assert limited
    for rate_limits in limited:
        levels = []
        for descriptor in rate_limits:
            gate = descriptor["actions"][-1]["header_value_match"]
            # No header (an older auth): the descriptor is sent. Its level listed: dropped.
            assert gate["expect_match"] is False
            assert gate["headers"] == [
                {
                    "name": NO_RATE_LIMIT_HEADER,
                    "string_match": {"contains": gate["descriptor_value"]},
                }
            ]
            levels.append(gate["descriptor_value"])
        assert levels == ["key", "tenant"]
    # A client cannot mark itself unlimited: the header is stripped before ext_authz.
    assert NO_RATE_LIMIT_HEADER in IDENTITY_HEADERS


def test_local_edge_sends_ext_authz_and_rate_limits_to_the_lean_listener() -> None:
    config = CONFIGS["local"]
    edge = clusters(config)["auth_edge"]
    assert edge["health_checks"][0]["grpc_health_check"]["service_name"] == AUTH_EDGE_HEALTH
    text = json.dumps(config)
    assert '"cluster_name": "auth_edge"' in text
    # Without the listener (the default) both filters use auth's main port.
    plain = bootstrap.local_config(layouts.local_layout(layouts.LocalPorts()))
    assert "auth_edge" not in json.dumps(plain)


def test_http_ext_authz_where_auth_has_the_http_listener() -> None:
    config = CONFIGS["local-http-authz"]
    authz = edge_filter("envoy.filters.http.ext_authz", "local-http-authz")
    assert "grpc_service" not in authz
    assert authz["failure_mode_allow"] is False
    service = authz["http_service"]
    assert service["server_uri"]["cluster"] == "auth_http"
    assert service["path_prefix"] == "/authz"
    upstream = service["authorization_response"]["allowed_upstream_headers"]["patterns"]
    assert {p["exact"] for p in upstream} == set(IDENTITY_HEADERS)
    # Rate limits stay on gRPC, on the edge listener.
    limits = edge_filter("envoy.filters.http.ratelimit", "local-http-authz")
    assert limits["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"] == "auth_edge"
    # Scopes ride in the per-route path prefix.
    edge = by_name(config, "edge_http")
    chat = edge["/v1/chat/completions"]["typed_per_filter_config"]["envoy.filters.http.ext_authz"]
    assert chat["check_settings"]["http_service"]["path_prefix"] == "/authz;scopes=completion:write"
    usage = edge["GetUsage"]["typed_per_filter_config"]["envoy.filters.http.ext_authz"]
    assert usage["check_settings"]["http_service"]["path_prefix"] == "/authz;scopes=admin"
    cluster = clusters(config)["auth_http"]
    assert cluster["health_checks"][0]["http_health_check"] == {"path": "/healthz"}
