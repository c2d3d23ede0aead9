"""What a running Envoy holds, read from its admin: xDS versions and rejections, the active
clusters and routes (`/config_dump`), and counters (`/stats`)."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any

Config = dict[str, Any]
ADMIN_TIMEOUT_S = 5.0


def _get(admin: str, path: str) -> bytes:
    with urllib.request.urlopen(f"http://{admin}{path}", timeout=ADMIN_TIMEOUT_S) as reply:
        body: bytes = reply.read()
        return body


def stats(admin: str, pattern: str = "") -> dict[str, str]:
    """`name: value` lines of `/stats` (counters, gauges, text readouts) matching a regex."""
    query = f"?filter={urllib.parse.quote(pattern)}" if pattern else ""
    found = {}
    for line in _get(admin, f"/stats{query}").decode().splitlines():
        name, sep, value = line.partition(": ")
        if sep:
            found[name] = value.strip().strip('"')
    return found


def stats_text(admin: str) -> str:
    """Envoy's stats in Prometheus' text format, as Prometheus scrapes them."""
    return _get(admin, "/stats/prometheus").decode()


def config_dump(admin: str) -> Config:
    dump: Config = json.loads(_get(admin, "/config_dump"))
    return dump


def _section(dump: Config, kind: str) -> Config:
    for config in dump["configs"]:
        if config["@type"].endswith(f".{kind}"):
            found: Config = config
            return found
    return {}


def active_clusters(dump: Config) -> dict[str, Config]:
    """Cluster name -> the cluster Envoy runs (from CDS, or static)."""
    section = _section(dump, "ClustersConfigDump")
    entries = section.get("dynamic_active_clusters", []) + section.get("static_clusters", [])
    return {e["cluster"]["name"]: e["cluster"] for e in entries}


def active_routes(dump: Config) -> dict[str, dict[str, Config]]:
    """Route table name -> route name -> route, as Envoy runs them (from RDS, or inline)."""
    section = _section(dump, "RoutesConfigDump")
    entries = section.get("dynamic_route_configs", []) + section.get("static_route_configs", [])
    tables: dict[str, dict[str, Config]] = {}
    for entry in entries:
        table = entry["route_config"]
        routes: dict[str, Config] = {}
        for vhost in table.get("virtual_hosts", []):
            routes |= {r["name"]: r for r in vhost.get("routes", []) if "name" in r}
        tables[table["name"]] = routes
    return tables


@dataclass(frozen=True, slots=True)
class XdsState:
    """The versions Envoy accepted and how many updates it refused, per xDS file."""

    versions: dict[str, str]  # "cds", "lds", "rds:<table>" -> version text
    rejected: int

    def all_at(self, version: str, keys: list[str] | None = None) -> bool:
        """Whether every subscription in `keys` (default: all) runs `version`."""
        chosen = list(self.versions) if keys is None else keys
        return bool(self.versions) and all(self.versions.get(k) == version for k in chosen)


def xds_state(admin: str, route_tables: list[str]) -> XdsState:
    """Versions from `/config_dump` (what Envoy runs), refusals from the xDS counters."""
    dump = config_dump(admin)
    versions = {
        "cds": _section(dump, "ClustersConfigDump").get("version_info", ""),
        "lds": _section(dump, "ListenersConfigDump").get("version_info", ""),
    }
    dynamic = _section(dump, "RoutesConfigDump").get("dynamic_route_configs", [])
    by_name = {e["route_config"]["name"]: e.get("version_info", "") for e in dynamic}
    for table in route_tables:
        versions[f"rds:{table}"] = by_name.get(table, "")
    found = stats(admin, r"update_rejected$")
    rejected = sum(int(v) for v in found.values() if v.isdigit())
    return XdsState(versions, rejected)
