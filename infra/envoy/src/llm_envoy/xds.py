"""Filesystem xDS: a whole (static) config split into a bootstrap and the files Envoy watches.

Clusters (CDS), listeners (LDS) and each listener's routes (RDS) come from files in `xds/`
beside the bootstrap. Envoy re-reads them when a file is moved into the watched directory,
so a new file must arrive by rename (write elsewhere in the directory, then `os.replace`):
an in-place rewrite is not noticed. Route changes replace a route table under running
connections; cluster changes drain the old connection pools; listener changes (edge filters)
drain the old listener's connections gracefully, in-flight streams finishing.
"""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass
from typing import Any

Config = dict[str, Any]
XDS_DIR = "xds"
CDS_FILE = "cds.yaml"
LDS_FILE = "lds.yaml"
CLUSTER_TYPE = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
LISTENER_TYPE = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE_TYPE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
HCM_NAME = "envoy.filters.network.http_connection_manager"


def rds_file(route_config: str) -> str:
    return f"rds-{route_config}.yaml"


@dataclass(frozen=True, slots=True)
class XdsConfig:
    """A bootstrap that names the xDS files, and each file's DiscoveryResponse."""

    bootstrap: Config
    files: dict[str, Config]  # file name in XDS_DIR -> DiscoveryResponse

    @property
    def version(self) -> str:
        """One version for the whole set: a policy change moves every file's version."""
        version: str = self.files[CDS_FILE]["version_info"]
        return version


def source(path: str, xds_dir: str = XDS_DIR) -> Config:
    """A ConfigSource reading `path`, re-read when a file is moved into `xds_dir`."""
    return {
        "path_config_source": {"path": path, "watched_directory": {"path": xds_dir}},
        "resource_api_version": "V3",
    }


def _version(static: Config) -> str:
    resources = static["static_resources"]
    text = json.dumps(resources, sort_keys=True).encode()
    return hashlib.sha256(text).hexdigest()[:16]


def _response(type_url: str, resources: list[Config], version: str) -> Config:
    return {
        "version_info": version,
        "type_url": type_url,
        "resources": [{"@type": type_url, **r} for r in resources],
    }


def _hcm(listener: Config) -> Config | None:
    for chain in listener.get("filter_chains", []):
        for network_filter in chain.get("filters", []):
            if network_filter["name"] == HCM_NAME:
                typed: Config = network_filter["typed_config"]
                return typed
    return None


def split(static: Config, xds_dir: str = XDS_DIR) -> XdsConfig:
    """The bootstrap (no static listeners or clusters) and the xDS files of `static`."""
    version = _version(static)
    listeners = copy.deepcopy(static["static_resources"]["listeners"])
    clusters = copy.deepcopy(static["static_resources"]["clusters"])
    files: dict[str, Config] = {}
    for listener in listeners:
        hcm = _hcm(listener)
        if hcm is None or "route_config" not in hcm:
            continue
        routes = hcm.pop("route_config")
        name = routes["name"]
        files[rds_file(name)] = _response(ROUTE_TYPE, [routes], version)
        hcm["rds"] = {
            "route_config_name": name,
            "config_source": source(f"{xds_dir}/{rds_file(name)}", xds_dir),
        }
    files[CDS_FILE] = _response(CLUSTER_TYPE, clusters, version)
    files[LDS_FILE] = _response(LISTENER_TYPE, listeners, version)
    boot = {k: v for k, v in static.items() if k != "static_resources"}
    boot["dynamic_resources"] = {
        "cds_config": source(f"{xds_dir}/{CDS_FILE}", xds_dir),
        "lds_config": source(f"{xds_dir}/{LDS_FILE}", xds_dir),
    }
    return XdsConfig(bootstrap=boot, files=files)


def _strip_type(resource: Config) -> Config:
    return {k: v for k, v in resource.items() if k != "@type"}


def join(xds: XdsConfig) -> Config:
    """The static config `split` came from (what `envoy --mode validate` checks); `xds` is
    left as it was."""
    listeners = [_strip_type(r) for r in copy.deepcopy(xds.files[LDS_FILE]["resources"])]
    for listener in listeners:
        hcm = _hcm(listener)
        if hcm is not None and "rds" in hcm:
            name = hcm.pop("rds")["route_config_name"]
            hcm["route_config"] = _strip_type(xds.files[rds_file(name)]["resources"][0])
    clusters = [_strip_type(r) for r in xds.files[CDS_FILE]["resources"]]
    static = {k: v for k, v in xds.bootstrap.items() if k != "dynamic_resources"}
    static["static_resources"] = {"listeners": listeners, "clusters": clusters}
    return static
