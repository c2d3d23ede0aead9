"""HTTP filters, access logs and tracing shared by the edge and mesh listeners."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llm_envoy.body_limits import buffer_filter
from llm_envoy.clusters import dns_cache_config
from llm_envoy.local_bucket import refusal_headers
from llm_envoy.policy_model import (
    AUTHZ_ERROR_STATUSES,
    EdgePolicy,
    ExtAuthz,
    Limits,
    LocalRateLimit,
    RateLimit,
    seconds,
)
from llm_envoy.query_scrub import query_scrub_filter
from llm_envoy.topology import (
    AUTH_EDGE,
    AUTH_HTTP,
    AUTH_HTTP_PREFIX,
    DESCRIPTOR,
    LLM_SERVICE,
    REPLICA_HEADER,
)

Config = dict[str, Any]
EXT_AUTHZ = "envoy.filters.http.ext_authz"
RATELIMIT = "envoy.filters.http.ratelimit"
RBAC = "envoy.filters.http.rbac"
TRANSCODER = "envoy.filters.http.grpc_json_transcoder"
DYNAMIC_FORWARD_PROXY = "envoy.filters.http.dynamic_forward_proxy"
RATE_LIMIT_DOMAIN = "llm-api"
OTEL_CLUSTER = "otel_collector"
# Set by ext_authz: the request-rate descriptors ("key", "tenant") with no limit for the
# caller, which the edge then does not send to the rate-limit service.
NO_RATE_LIMIT_HEADER = "x-no-rate-limit"
# Set by ext_authz from the verified credential; a client must never be able to send them.
IDENTITY_HEADERS = (
    "x-tenant-id",
    "x-key-id",
    "x-scopes",
    "x-credential-type",
    "x-allowed-models",
    NO_RATE_LIMIT_HEADER,
)
# The client's content type, copied for auth (its denial body is JSON for HTTP clients and
# plain text, i.e. grpc-message, for gRPC ones). Not content-type itself: with
# `application/grpc` on the check request, a check that cannot reach auth comes back as
# Envoy's gRPC-shaped local reply (HTTP 200 with grpc-status 14), which ext_authz's HTTP
# client takes for "allowed": with auth down, gRPC calls went on with no identity.
AUTHZ_CONTENT_TYPE_HEADER = "x-authz-content-type"
# Headers ext_authz needs: the credential, the requested model, the content type, and the
# client's address (the edge sets x-envoy-external-address for external clients and appends
# the peer to x-forwarded-for: auth throttles failed authentication per address).
AUTHZ_HEADERS = (
    "authorization",
    "x-api-key",
    "x-model",
    AUTHZ_CONTENT_TYPE_HEADER,
    "x-envoy-external-address",
    "x-forwarded-for",
)
# What auth's HTTP ext_authz may tell a denied client (the rest of its reply stays inside).
AUTHZ_CLIENT_HEADERS = ("content-type", "www-authenticate", "retry-after")
LOCAL_RATELIMIT = "envoy.filters.http.local_ratelimit"


@dataclass(frozen=True, slots=True)
class AuthTargets:
    """Where the edge asks auth: ext_authz (Check over gRPC, or auth's HTTP listener) and the
    rate-limit service (always gRPC)."""

    authz_cluster: str
    authz_http: bool
    ratelimit_cluster: str
    authz_timeout: str = "0.5s"

    @classmethod
    def of(cls, upstreams: Mapping[str, object], authz: ExtAuthz | None = None) -> AuthTargets:
        """The leanest listeners the layout has: HTTP ext_authz, the gRPC edge listener, or
        auth's main port."""
        timeout = seconds((authz or ExtAuthz()).timeout_s)
        grpc_cluster = AUTH_EDGE if AUTH_EDGE in upstreams else "auth"
        if AUTH_HTTP in upstreams:
            return cls(AUTH_HTTP, True, grpc_cluster, timeout)
        return cls(grpc_cluster, False, grpc_cluster, timeout)


_TYPES = {
    "health_check": "envoy.extensions.filters.http.health_check.v3.HealthCheck",
    "header_mutation": "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
    EXT_AUTHZ: "envoy.extensions.filters.http.ext_authz.v3.ExtAuthz",
    TRANSCODER: "envoy.extensions.filters.http.grpc_json_transcoder.v3.GrpcJsonTranscoder",
    RBAC: "envoy.extensions.filters.http.rbac.v3.RBAC",
    RATELIMIT: "envoy.extensions.filters.http.ratelimit.v3.RateLimit",
    LOCAL_RATELIMIT: "envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
    DYNAMIC_FORWARD_PROXY: "envoy.extensions.filters.http.dynamic_forward_proxy.v3.FilterConfig",
    "router": "envoy.extensions.filters.http.router.v3.Router",
}


def typed(type_name: str, **fields: Any) -> Config:
    return {"@type": f"type.googleapis.com/{type_name}", **fields}


def _filter(name: str, short: str, **fields: Any) -> Config:
    return {"name": name, "typed_config": typed(_TYPES[short], **fields)}


def health_check_filter() -> Config:
    """`/healthz` for load balancers: 503 once `/healthcheck/fail` was posted to the admin
    (the first step of a drain), 200 otherwise; answered by Envoy itself."""
    return _filter(
        "envoy.filters.http.health_check",
        "health_check",
        pass_through_mode=False,
        headers=[{"name": ":path", "string_match": {"exact": "/healthz"}}],
    )


def strip_identity_filter() -> Config:
    """Client-sent identity headers go before ext_authz runs (route-level
    request_headers_to_remove would run after ext_authz and delete what it set), and the
    content type is copied for the check (AUTHZ_CONTENT_TYPE_HEADER)."""
    removals: list[Config] = [{"remove": h} for h in (*IDENTITY_HEADERS, REPLICA_HEADER)]
    copy = {
        "append": {
            "header": {"key": AUTHZ_CONTENT_TYPE_HEADER, "value": "%REQ(content-type)%"},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }
    }
    return _filter(
        "envoy.filters.http.header_mutation",
        "header_mutation",
        mutations={"request_mutations": [*removals, copy]},
    )


def http_authz_service(cluster: str, timeout: str, scopes: tuple[str, ...] = ()) -> Config:
    """ext_authz's `http_service` for auth's HTTP listener (llm_auth.http_authz). A route's
    required scopes ride in the path prefix: clients cannot change it, only follow it."""
    prefix = f"{AUTH_HTTP_PREFIX};scopes={','.join(scopes)}" if scopes else AUTH_HTTP_PREFIX
    return {
        "server_uri": {"uri": f"http://{cluster}", "cluster": cluster, "timeout": timeout},
        "path_prefix": prefix,
        "authorization_response": {
            # Identity headers overwrite any a client sent; the credential is removed by
            # auth's x-envoy-auth-headers-to-remove.
            "allowed_upstream_headers": {"patterns": [{"exact": h} for h in IDENTITY_HEADERS]},
            "allowed_client_headers": {"patterns": [{"exact": h} for h in AUTHZ_CLIENT_HEADERS]},
        },
    }


def ext_authz_filter(targets: AuthTargets, authz: ExtAuthz) -> Config:
    """Fail closed by default: with auth down a request must not pass unauthenticated."""
    service: Config = (
        {"http_service": http_authz_service(targets.authz_cluster, targets.authz_timeout)}
        if targets.authz_http
        else {
            "grpc_service": {
                "envoy_grpc": {"cluster_name": targets.authz_cluster},
                "timeout": targets.authz_timeout,
            }
        }
    )
    return _filter(
        EXT_AUTHZ,
        EXT_AUTHZ,
        transport_api_version="V3",
        **service,
        failure_mode_allow=authz.failure_mode_allow,
        status_on_error={"code": AUTHZ_ERROR_STATUSES[authz.status_on_error]},
        allowed_headers={"patterns": [{"exact": h} for h in AUTHZ_HEADERS]},
    )


def transcoder_filter(limits: Limits) -> Config:
    """REST/JSON for LLMService at `POST /llmapi.llm.v1.LLMService/<Method>` (auto mapping),
    streams as server-sent events. Errors become HTTP statuses with a JSON google.rpc.Status."""
    sizes: Config = {}
    if limits.max_request_body_bytes is not None:
        sizes["max_request_body_size"] = limits.max_request_body_bytes
    if limits.max_response_body_bytes is not None:
        sizes["max_response_body_size"] = limits.max_response_body_bytes
    return _filter(
        TRANSCODER,
        TRANSCODER,
        proto_descriptor=DESCRIPTOR,
        services=[LLM_SERVICE],
        auto_mapping=True,
        # Without it a query string (`?key=...`) made the method unmatched: the JSON body
        # went to the router untranscoded and came back as a retryable 503 (stream reset).
        ignore_unknown_query_parameters=True,
        convert_grpc_status=True,
        print_options={
            "add_whitespace": False,
            "always_print_primitive_fields": True,
            "preserve_proto_field_names": True,
            "stream_sse_style_delimited": True,
        },
        **sizes,
    )


def rbac_filter(rules: Config | None = None) -> Config:
    """Without `rules` it enforces nothing itself and is there for per-route policies."""
    return _filter(RBAC, RBAC) if rules is None else _filter(RBAC, RBAC, rules=rules)


def ratelimit_filter(cluster: str, policy: RateLimit) -> Config:
    """Requests per minute per key and tenant, decided by auth's RateLimitService.

    After the transcoder, so it sees the gRPC route. Fails open (a rate-limit outage must not
    stop traffic); RESOURCE_EXHAUSTED for gRPC callers instead of the retryable UNAVAILABLE.
    """
    return _filter(
        RATELIMIT,
        RATELIMIT,
        domain=RATE_LIMIT_DOMAIN,
        stage=0,
        timeout=seconds(policy.timeout_s),  # Envoy's 20 ms is too tight for a Python service
        failure_mode_deny=policy.failure_mode_deny,
        rate_limited_as_resource_exhausted=True,
        enable_x_ratelimit_headers="DRAFT_VERSION_03",
        rate_limit_service={
            "transport_api_version": "V3",
            "grpc_service": {"envoy_grpc": {"cluster_name": cluster}},
        },
    )


def dynamic_forward_proxy_filter() -> Config:
    return _filter(
        DYNAMIC_FORWARD_PROXY, DYNAMIC_FORWARD_PROXY, dns_cache_config=dns_cache_config()
    )


def router_filter() -> Config:
    return _filter("envoy.filters.http.router", "router")


def local_ratelimit_filter(bucket: LocalRateLimit) -> Config:
    """One token bucket per Envoy for every request, before auth is asked: a flood is
    refused here (RESOURCE_EXHAUSTED / 429) instead of reaching auth."""
    percent = {"numerator": 100, "denominator": "HUNDRED"}
    return _filter(
        LOCAL_RATELIMIT,
        LOCAL_RATELIMIT,
        stat_prefix="edge_local_rate_limit",
        token_bucket={
            "max_tokens": bucket.max_tokens,
            "tokens_per_fill": bucket.tokens_per_fill,
            "fill_interval": seconds(bucket.fill_interval_s),
        },
        filter_enabled={"runtime_key": "edge.local_rate_limit.enabled", "default_value": percent},
        filter_enforced={"runtime_key": "edge.local_rate_limit.enforced", "default_value": percent},
        rate_limited_as_resource_exhausted=True,
        response_headers_to_add=refusal_headers(bucket),  # message, retry-after, RetryInfo
    )


def edge_filters(targets: AuthTargets, policy: EdgePolicy) -> list[Config]:
    """Order matters: scrub credentials from the query, strip spoofed identity, (bucket,)
    bound the body, authenticate, transcode, rate limit, route. The body limit goes before
    ext_authz: a body that arrives whole while auth is asked would reach a later buffer
    filter as complete, unchecked."""
    bucket = (
        [] if policy.local_rate_limit is None else [local_ratelimit_filter(policy.local_rate_limit)]
    )
    return [
        query_scrub_filter(),  # before anything reads the path (llm_envoy.query_scrub)
        health_check_filter(),
        strip_identity_filter(),
        *bucket,
        *buffer_filter(policy.limits),
        ext_authz_filter(targets, policy.ext_authz),
        rbac_filter(),
        transcoder_filter(policy.limits),
        ratelimit_filter(targets.ratelimit_cluster, policy.rate_limit),
        router_filter(),
    ]


# The path without its query string (issue 32, finding 4): a key sent as `?api_key=...` was
# refused but written to the log. Dropping the whole query is the only scrub that is
# case- and encoding-proof (`?API%5Fkey=`); none of the public routes takes a query
# parameter the log needs.
PATH_WITHOUT_QUERY = "%REQ_WITHOUT_QUERY(X-ENVOY-ORIGINAL-PATH?:PATH)%"
_REQ_WITHOUT_QUERY = {
    "name": "envoy.formatter.req_without_query",
    "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.formatter.req_without_query.v3"
        ".ReqWithoutQuery"
    },
}


def access_log(stat_prefix: str) -> list[Config]:
    """One JSON line per request on stdout (buffered about a second by Envoy); never the
    query string."""
    fields = {
        "ts": "%START_TIME(%Y-%m-%dT%H:%M:%S.%3fZ)%",
        "listener": stat_prefix,
        "method": "%REQ(:METHOD)%",
        "path": PATH_WITHOUT_QUERY,
        "protocol": "%PROTOCOL%",
        "code": "%RESPONSE_CODE%",
        "grpc_status": "%GRPC_STATUS(NUMBER)%",
        "flags": "%RESPONSE_FLAGS%",
        "details": "%RESPONSE_CODE_DETAILS%",
        "duration_ms": "%DURATION%",
        "upstream_ms": "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%",
        "rx_bytes": "%BYTES_RECEIVED%",
        "tx_bytes": "%BYTES_SENT%",
        "upstream_host": "%UPSTREAM_HOST%",
        "upstream_cluster": "%UPSTREAM_CLUSTER%",
        "attempts": "%UPSTREAM_REQUEST_ATTEMPT_COUNT%",
        "request_id": "%REQ(X-REQUEST-ID)%",
        "trace_id": "%TRACE_ID%",
        "tenant": "%REQ(X-TENANT-ID)%",
        "key_id": "%REQ(X-KEY-ID)%",
        "user_agent": "%REQ(USER-AGENT)%",
    }
    return [
        {
            "name": "envoy.access_loggers.stdout",
            "typed_config": typed(
                "envoy.extensions.access_loggers.stream.v3.StdoutAccessLog",
                log_format={
                    "json_format": fields,
                    "json_format_options": {"sort_properties": False},
                    "formatters": [_REQ_WITHOUT_QUERY],
                },
            ),
        }
    ]


def tracing(service_name: str) -> Config:
    """W3C trace context; a server span per request and a client span per upstream attempt."""
    return {
        "random_sampling": {"value": 100},
        "spawn_upstream_span": True,
        "custom_tags": [
            {"tag": "tenant", "request_header": {"name": "x-tenant-id", "default_value": "-"}}
        ],
        "provider": {
            "name": "envoy.tracers.opentelemetry",
            "typed_config": typed(
                "envoy.config.trace.v3.OpenTelemetryConfig",
                service_name=service_name,
                grpc_service={"envoy_grpc": {"cluster_name": OTEL_CLUSTER}, "timeout": "1s"},
            ),
        },
    }


def tracing_runtime() -> Config:
    """Flush spans every second, from the first one (defaults: 5 s and 5 spans)."""
    return {
        "tracing.opentelemetry.flush_interval_ms": 1000,
        "tracing.opentelemetry.min_flush_spans": 1,
    }
