"""Who can reach Envoy's admin (issue 32, finding 7): it answers every request without a
credential, and some can stop the proxy or change it (`/quitquitquit`, `/drain_listeners`,
`/healthcheck/fail`, `/logging`, `/runtime_modify`, `/reset_counters`, the profilers) or dump
its whole configuration (`/config_dump`).

- **The admin listens on a unix socket** (`pipe`, mode 0600) where another process shares
  Envoy's loopback: locally, one Envoy for the stack on the host's network (every local user
  and container on it could reach 127.0.0.1); in Kubernetes, each service pod's sidecar (the
  app container shares the pod's loopback). Only Envoy's own user can open the socket: the
  file permission is the credential. Operators use it for the mutating endpoints
  (`curl --unix-socket .run/envoy/logs/admin.sock -X POST http://admin/healthcheck/fail`).
- **Readers get a read-only listener**: locally on 127.0.0.1 at the old admin port, so
  `mesh-show`/`mesh-status`/`mesh-apply`, the stack's probes, Prometheus and the image's
  health check keep working: GET (and HEAD) of READ_ONLY_PATHS, proxied to the socket;
  anything else 404. In Kubernetes the stats listener (9902, what Prometheus scrapes) has only
  `/stats/prometheus` and `/ready`.
- The gateway pod in Kubernetes holds only Envoy, so its loopback is Envoy's own: its admin
  stays on 127.0.0.1 for the preStop hook (`POST /healthcheck/fail` with the image's wget).
- No edge listener routes to the admin (the edge's catch-all answers 404).
"""

from __future__ import annotations

from typing import Any

from llm_envoy.topology import LOG_DIR, Endpoint

Config = dict[str, Any]
# Locally: in Envoy's log directory, the one directory of its working directory it may write
# to when it runs as its own user (compose: uid 101; infra/docker/images.py opens it, sticky).
ADMIN_SOCKET = f"{LOG_DIR}/admin.sock"
K8S_ADMIN_DIR = "/var/run/envoy"  # an emptyDir mounted into the Envoy container only
K8S_ADMIN_SOCKET = f"{K8S_ADMIN_DIR}/admin.sock"
SOCKET_MODE = 0o600
# What readers need: readiness, counters (also Prometheus'), cluster health, the running
# config (mesh-show, mesh-apply), heap figures (bench-security), server info.
READ_ONLY_PATHS = (
    "/ready",
    "/stats",
    "/stats/prometheus",
    "/clusters",
    "/config_dump",
    "/memory",
    "/server_info",
)
STATS_PATHS = ("/stats/prometheus", "/ready")  # Kubernetes' stats listener: Prometheus, probes


def admin_address(endpoint: Endpoint, socket_path: str | None) -> Config:
    """The admin's bind address: the socket when there is one, else `endpoint` (loopback)."""
    if socket_path is not None:
        return {"pipe": {"path": socket_path, "mode": SOCKET_MODE}}
    return {"socket_address": {"address": endpoint.host, "port_value": endpoint.port}}


def read_only_routes(cluster: str, paths: tuple[str, ...]) -> list[Config]:
    """GET/HEAD of exactly `paths` (a query string allowed: `/stats?filter=...`) to the admin;
    any other path or method: 404."""
    read = {
        "name": ":method",
        "string_match": {"safe_regex": {"regex": "GET|HEAD"}},
    }
    routes: list[Config] = [
        {
            "match": {"path": path, "headers": [read]},
            "route": {"cluster": cluster, "timeout": "5s"},
        }
        for path in paths
    ]
    routes.append({"match": {"prefix": "/"}, "direct_response": {"status": 404}})
    return routes
