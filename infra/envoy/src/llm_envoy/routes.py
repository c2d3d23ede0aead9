"""Routes: which path goes where, with which timeouts, retries, scopes and rate limits."""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any

from llm_envoy.clusters import REPLICA_CLUSTER
from llm_envoy.filters import (
    DYNAMIC_FORWARD_PROXY,
    EXT_AUTHZ,
    NO_RATE_LIMIT_HEADER,
    RBAC,
    AuthTargets,
    http_authz_service,
    typed,
)
from llm_envoy.policy_model import (
    EdgeRoutes,
    GenerationRoute,
    MeshRoutes,
    RetryPolicy,
    StreamRoute,
    UnaryRoute,
    seconds,
)
from llm_envoy.topology import LLM_SERVICE, REPLICA_HEADER, SERVICES, Layout, ReplicaPath

Config = dict[str, Any]
SCOPE_COMPLETION = "completion:write"
SCOPE_EMBEDDING = "embedding:read"
SCOPE_ADMIN = "admin"
# Retry conditions come from the policy (RetryPolicy): `retry_on` for idempotent calls
# (every mesh call is idempotent by its id), `retry_on_not_idempotent` where a replay could
# repeat work (generation at the edge: the router re-dispatches inference itself; counters).
RoutePolicy = UnaryRoute | StreamRoute | GenerationRoute


class Kind(enum.Enum):
    """How a method behaves on the wire, which decides its timeouts and retries."""

    STREAM = "stream"  # server-streaming generation: no route timeout, idle timeout per chunk
    LONG_UNARY = "long_unary"  # unary generation: silent until done
    UNARY = "unary"  # quick request/response


@dataclass(frozen=True, slots=True)
class Method:
    """One public method and what the edge demands of its caller."""

    name: str
    kind: Kind
    scopes: tuple[str, ...] = ()
    rate_limited: bool = True


LLM_METHODS = (
    Method("Chat", Kind.LONG_UNARY, (SCOPE_COMPLETION,)),
    Method("ChatStream", Kind.STREAM, (SCOPE_COMPLETION,)),
    Method("Complete", Kind.LONG_UNARY, (SCOPE_COMPLETION,)),
    Method("CompleteStream", Kind.STREAM, (SCOPE_COMPLETION,)),
    Method("Embed", Kind.LONG_UNARY, (SCOPE_EMBEDDING,)),
    Method("CountTokens", Kind.UNARY),
    Method("ListModels", Kind.UNARY),
)
# The OpenAI-compatible paths: a request may stream or not, so all get the streaming idle
# allowance of a unary generation.
OPENAI_PATHS = (
    ("/v1/chat/completions", (SCOPE_COMPLETION,)),
    ("/v1/completions", (SCOPE_COMPLETION,)),
    ("/v1/embeddings", (SCOPE_EMBEDDING,)),
)
# Key administration authenticates the admin credential itself (ext_authz would strip it).
AUTH_ADMIN_METHODS = ("CreateKey", "ListKeys", "RevokeKey", "RotateKey", "ForgetTenant")
# Billing trusts its callers: its admin methods need an admin of the admin tenant.
BILLING_ADMIN_METHODS = (
    Method("GetUsage", Kind.UNARY, (SCOPE_ADMIN,), rate_limited=False),
    Method("GetBudget", Kind.UNARY, (SCOPE_ADMIN,), rate_limited=False),
    Method("SetBudget", Kind.UNARY, (SCOPE_ADMIN,), rate_limited=False),
    Method("ExportUsage", Kind.STREAM, (SCOPE_ADMIN,), rate_limited=False),
    # Idempotent per tenant and month: a retried CreateInvoice returns the same invoice.
    Method("CreateInvoice", Kind.UNARY, (SCOPE_ADMIN,), rate_limited=False),
    Method("GetInvoice", Kind.UNARY, (SCOPE_ADMIN,), rate_limited=False),
    Method("ForgetTenant", Kind.UNARY, (SCOPE_ADMIN,), rate_limited=False),
)
CACHE_ADMIN_METHODS = (
    Method("Stats", Kind.UNARY, (SCOPE_ADMIN,), rate_limited=False),
    Method("Invalidate", Kind.UNARY, (SCOPE_ADMIN,), rate_limited=False),
    Method("ForgetTenant", Kind.UNARY, (SCOPE_ADMIN,), rate_limited=False),
)


def grpc_path(service: str, method: str) -> str:
    return f"/{service}/{method}"


def retry_conditions(retry: RetryPolicy, idempotent: bool) -> str:
    return ",".join(retry.retry_on if idempotent else retry.retry_on_not_idempotent)


def retry_policy(retry: RetryPolicy, retry_on: str, per_try_timeout: str | None = None) -> Config:
    """Fully jittered back-off, never the same host twice. `reset` is in the idempotent set
    because a per-try timeout is only retried with reset/5xx/gateway-error."""
    back_off = {
        "base_interval": seconds(retry.backoff_base_s),
        "max_interval": seconds(retry.backoff_max_s),
    }
    policy: Config = {
        "retry_on": retry_on,
        "num_retries": retry.num_retries,
        "retry_back_off": back_off,
        "retry_host_predicate": [
            {
                "name": "envoy.retry_host_predicates.previous_hosts",
                "typed_config": typed(
                    "envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"
                ),
            }
        ],
        "host_selection_retry_max_attempts": retry.host_selection_max_attempts,
    }
    if per_try_timeout is not None:
        policy["per_try_timeout"] = per_try_timeout
    return policy


def _stream_duration(max_s: float) -> Config:
    # Without grpc_timeout_header_max Envoy ignores the client's grpc-timeout for its timer.
    return {"max_stream_duration": seconds(max_s), "grpc_timeout_header_max": seconds(max_s)}


def route_action(cluster: str, policy: RoutePolicy, *, idempotent: bool) -> Config:
    """Timeouts by route class: streams and generations are free of the 15 s default route
    timeout.

    A stream gets no Envoy timer at all: Envoy can only reset a stream that has started
    (clients read RST_STREAM as INTERNAL), and with any max_stream_duration on the route it
    rewrites the client's grpc-timeout. Without one the header reaches the service as sent,
    which ends the stream with DEADLINE_EXCEEDED in-band; the idle timeout catches a stall.
    """
    action: Config = {"cluster": cluster}
    retry_on = retry_conditions(policy.retry, idempotent)
    if isinstance(policy, StreamRoute):
        action |= {"timeout": "0s", "idle_timeout": seconds(policy.idle_timeout_s)}
        action["retry_policy"] = retry_policy(policy.retry, retry_on)
    elif isinstance(policy, GenerationRoute):
        # Nothing flows until the answer is complete, so the idle timer spans the whole call.
        action |= {"timeout": "0s", "idle_timeout": seconds(policy.idle_timeout_s)}
        action["max_stream_duration"] = _stream_duration(policy.max_duration_s)
        action["retry_policy"] = retry_policy(policy.retry, retry_on)
    else:
        action["timeout"] = seconds(policy.timeout_s)
        action["max_stream_duration"] = {"grpc_timeout_header_max": seconds(policy.timeout_s)}
        # A per-try timeout is only retried with `reset` in retry_on; without it, it would
        # just cut the call short.
        per_try = seconds(policy.per_try_timeout_s) if "reset" in retry_on.split(",") else None
        action["retry_policy"] = retry_policy(policy.retry, retry_on, per_try_timeout=per_try)
    return action


def edge_class(routes: EdgeRoutes, method: Method) -> RoutePolicy:
    """A method's route class at the edge: its kind, admin methods apart."""
    if method.kind is Kind.STREAM:
        return routes.streaming
    if method.kind is Kind.LONG_UNARY:
        return routes.generation
    return routes.admin if SCOPE_ADMIN in method.scopes else routes.unary


def authz_context(scopes: tuple[str, ...], targets: AuthTargets) -> Config:
    """ext_authz for a route: the scopes the credential must hold (a context extension of
    Check, or the path prefix of the HTTP check)."""
    check: Config = {}
    if scopes and targets.authz_http:
        check = {
            "http_service": http_authz_service(targets.authz_cluster, targets.authz_timeout, scopes)
        }
    elif scopes:
        check = {"context_extensions": {"required_scopes": " ".join(scopes)}}
    settings = {"check_settings": check}  # the per-route override is a required oneof
    return {
        EXT_AUTHZ: typed("envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute", **settings)
    }


def authz_disabled() -> Config:
    return {
        EXT_AUTHZ: typed(
            "envoy.extensions.filters.http.ext_authz.v3.ExtAuthzPerRoute", disabled=True
        )
    }


def admin_tenant_only(tenant: str) -> Config:
    """RBAC: only callers that ext_authz identified as the admin tenant."""
    policy = {
        "permissions": [{"any": True}],
        "principals": [{"header": {"name": "x-tenant-id", "string_match": {"exact": tenant}}}],
    }
    rbac = {"rules": {"action": "ALLOW", "policies": {"admin-tenant": policy}}}
    return {RBAC: typed("envoy.extensions.filters.http.rbac.v3.RBACPerRoute", rbac=rbac)}


def rate_limits() -> list[Config]:
    """Two descriptors charged independently by auth's RLS: the key's own requests-per-minute
    and its tenant's. Both come from headers ext_authz set; without them the descriptor drops.
    A descriptor ext_authz marked as unlimited for the caller drops too, and with none left
    Envoy makes no rate-limit call at all: a key without request limits costs no round trip."""
    tenant = {"request_headers": {"header_name": "x-tenant-id", "descriptor_key": "tenant"}}
    key = {"request_headers": {"header_name": "x-key-id", "descriptor_key": "key_id"}}
    return [
        {"actions": [tenant, key, _limited("key")]},
        {"actions": [tenant, _limited("tenant")]},
    ]


def _limited(level: str) -> Config:
    """An entry `limited: <level>` unless ext_authz listed `level` as unlimited. Without the
    header (an auth from before it, or none) the entry is there and the descriptor is sent."""
    unlimited = {"name": NO_RATE_LIMIT_HEADER, "string_match": {"contains": level}}
    return {
        "header_value_match": {
            "descriptor_key": "limited",
            "descriptor_value": level,
            "expect_match": False,
            "headers": [unlimited],
        }
    }


def route_stat_prefix(name: str) -> str:
    """A route's stats prefix (`vhost.<vhost>.route.<prefix>.upstream_rq_time`, ...)."""
    return re.sub(r"[^A-Za-z0-9_-]+", "_", name).strip("_")


def _route(match: Config, action: Config, per_filter: Config, name: str) -> Config:
    # Per-route stats: latency and outcomes by method, not only by cluster.
    route: Config = {"name": name, "stat_prefix": route_stat_prefix(name), "match": match}
    route["route"] = action
    if per_filter:
        route["typed_per_filter_config"] = per_filter
    return route


def _edge_method_route(
    service: str, cluster: str, method: Method, per_filter: Config, routes: EdgeRoutes
) -> Config:
    idempotent = method.kind is Kind.UNARY
    action = route_action(cluster, edge_class(routes, method), idempotent=idempotent)
    if method.rate_limited:
        action["rate_limits"] = rate_limits()
    return _route({"path": grpc_path(service, method.name)}, action, per_filter, method.name)


def edge_routes(layout: Layout) -> list[Config]:
    """The public surface: LLMService (gRPC and REST), the OpenAI paths, the admin services."""
    routes: list[Config] = [
        _route(
            {"path": "/grpc.health.v1.Health/Check"},
            {"cluster": "router", "timeout": "5s"},
            authz_disabled(),
            "health",
        )
    ]
    targets = AuthTargets.of(layout.upstreams, layout.policy.edge.ext_authz)
    policy = layout.policy.edge_routes
    for method in LLM_METHODS:
        per_filter = authz_context(method.scopes, targets)
        routes.append(_edge_method_route(LLM_SERVICE, "router", method, per_filter, policy))
    routes.extend(_openai_routes(targets, policy))
    routes.extend(_admin_routes(layout, targets))
    routes.append(
        {
            "name": "unknown",
            "match": {"prefix": "/"},
            "direct_response": {"status": 404, "body": {"inline_string": "no such route\n"}},
        }
    )
    return routes


def _openai_routes(targets: AuthTargets, policy: EdgeRoutes) -> list[Config]:
    routes = []
    for path, scopes in OPENAI_PATHS:
        action = route_action("router_http", policy.generation, idempotent=False)
        action["rate_limits"] = rate_limits()
        routes.append(_route({"path": path}, action, authz_context(scopes, targets), path))
    models = route_action("router_http", policy.unary, idempotent=True)
    models.pop("max_stream_duration")
    routes.append(
        _route({"prefix": "/v1/models"}, models, authz_context((), targets), "/v1/models")
    )
    # Anything else under /v1/ gets the listener's OpenAI-shaped 404.
    other = route_action("router_http", policy.unary, idempotent=False)
    other.pop("max_stream_duration")
    routes.append(_route({"prefix": "/v1/"}, other, authz_context((), targets), "/v1/*"))
    return routes


def _admin_routes(layout: Layout, targets: AuthTargets) -> list[Config]:
    routes = []
    policy = layout.policy.edge_routes
    auth = SERVICES["auth"].grpc_service
    for name in AUTH_ADMIN_METHODS:
        action = route_action("auth", policy.admin, idempotent=False)
        routes.append(_route({"path": grpc_path(auth, name)}, action, authz_disabled(), name))
    admin_only = admin_tenant_only(layout.admin_tenant)
    for service, methods in (("billing", BILLING_ADMIN_METHODS), ("cache", CACHE_ADMIN_METHODS)):
        full = SERVICES[service].grpc_service
        for method in methods:
            per_filter = authz_context(method.scopes, targets) | admin_only
            routes.append(_edge_method_route(full, service, method, per_filter, policy))
    prices = Method("ListPrices", Kind.UNARY, rate_limited=False)
    billing = SERVICES["billing"].grpc_service
    no_scope = authz_context((), targets)
    routes.append(_edge_method_route(billing, "billing", prices, no_scope, policy))
    return routes


# The cache's change feed, one stream per router for its whole life. It sends a message at
# least every second, so a minute of silence (the policy's idle timeout) is a dead stream.
CACHE_FEED_METHOD = "WatchChanges"
CACHE_HITS_METHOD = "RecordHits"


def _mesh_unary(mesh: MeshRoutes, service: str) -> UnaryRoute:
    """A dependency's timeouts with the mesh's unary retries: a cache that answers late is
    worse than a miss; a tokenizer batch may take longer."""
    timeouts = mesh.services[service]
    return UnaryRoute(timeouts.timeout_s, timeouts.per_try_timeout_s, mesh.unary_retry)


def mesh_routes(layout: Layout) -> list[Config]:
    """What the router reaches through its mesh listener."""
    inference = SERVICES["inference"].grpc_service
    mesh = layout.policy.mesh_routes
    routes = _replica_routes(layout, inference)
    for method in ("Generate", "WatchLoad"):
        action = route_action("inference", mesh.streaming, idempotent=True)
        routes.append(
            _route({"path": grpc_path(inference, method)}, action, {}, f"inference-{method}")
        )
    balanced = route_action("inference", mesh.generation, idempotent=True)
    routes.append(_route({"prefix": f"/{inference}/"}, balanced, {}, "inference"))
    routes += [_cache_feed_route(mesh), _cache_hits_route(mesh)]
    for name in mesh.services:
        full = SERVICES[name].grpc_service
        action = route_action(name, _mesh_unary(mesh, name), idempotent=True)
        routes.append(_route({"prefix": f"/{full}/"}, action, {}, name))
    return routes


def _cache_feed_route(mesh: MeshRoutes) -> Config:
    """WatchChanges ahead of the cache's unary prefix route, whose timeout would cut it.

    No stream timer (see route_action), an idle timeout for a stalled stream, and no
    retries: the router reconnects with its own backoff (a hop is never retried at two
    layers), and a stream that waits for its first message is not a failure to retry.
    """
    idle = seconds(mesh.change_feed_idle_timeout_s)
    action: Config = {"cluster": "cache", "timeout": "0s", "idle_timeout": idle}
    path = grpc_path(SERVICES["cache"].grpc_service, CACHE_FEED_METHOD)
    return _route({"path": path}, action, {}, f"cache-{CACHE_FEED_METHOD}")


def _cache_hits_route(mesh: MeshRoutes) -> Config:
    """RecordHits adds counts, so it is the one cache call that is not idempotent: retried
    only where it cannot have reached the cache."""
    action = route_action("cache", _mesh_unary(mesh, "cache"), idempotent=False)
    path = grpc_path(SERVICES["cache"].grpc_service, CACHE_HITS_METHOD)
    return _route({"path": path}, action, {}, f"cache-{CACHE_HITS_METHOD}")


def _replica_routes(layout: Layout, inference: str) -> list[Config]:
    """The router's chosen replica (header present): no retries, it re-dispatches itself."""
    has_header = [{"name": REPLICA_HEADER, "present_match": True}]
    per_filter: Config = {}
    if layout.replica_path is ReplicaPath.DYNAMIC_DNS:
        per_filter[DYNAMIC_FORWARD_PROXY] = typed(
            "envoy.extensions.filters.http.dynamic_forward_proxy.v3.PerRouteConfig",
            host_rewrite_header=REPLICA_HEADER,
        )
    routes = []
    mesh = layout.policy.mesh_routes
    idle, timeout = seconds(mesh.replica_idle_timeout_s), seconds(mesh.replica_timeout_s)
    for method in ("Generate", "WatchLoad"):
        # No stream timer (see route_action): a WatchLoad stream lives as long as the router.
        action: Config = {"cluster": REPLICA_CLUSTER, "timeout": "0s", "idle_timeout": idle}
        match = {"path": grpc_path(inference, method), "headers": has_header}
        routes.append(_route(match, action, per_filter, f"replica-{method}"))
    unary: Config = {"cluster": REPLICA_CLUSTER, "timeout": timeout}
    unary["max_stream_duration"] = {"grpc_timeout_header_max": timeout}
    match = {"prefix": f"/{inference}/", "headers": has_header}
    routes.append(_route(match, unary, per_filter, "replica"))
    return routes
