"""`make up MESH_MTLS=1`: mutual TLS inside the one-host stack (docs/adr/0018).

Every service's port then demands a certificate from the local mesh CA (llm_common.server_tls),
so this Envoy presents its mesh certificate to each upstream and checks the upstream's SPIFFE id
(`spiffe://llm.local/ns/local/sa/<service>`); the mesh listener the router calls demands the
router's certificate. A local process without a certificate reaches neither the services' ports
nor the mesh listener, so it cannot forge the identity headers they trust. The edge listeners
are unchanged. The certificates are llm_stack.mesh_pki's, under Envoy's `certs/`.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from llm_envoy import bootstrap
from llm_envoy.clusters import REPLICA_CLUSTER, upstream_tls
from llm_envoy.topology import CERT_DIR, MESH_CA, SERVICES, Layout, spiffe_id

Config = dict[str, Any]
LOCAL_NAMESPACE = "local"
MESH_LISTENER = "mesh_outbound"
# The mesh listener's certificate names 127.0.0.1: the router's gRPC channel checks the host.
LISTENER_CERT = f"{CERT_DIR}/mesh-listener.crt"
LISTENER_KEY = f"{CERT_DIR}/mesh-listener.key"
# Upstream cluster -> the workload whose certificate it must present: the services' gRPC
# ports and the router's HTTP front end. auth's listeners for Envoy's own calls (ext_authz,
# rate limits) stay plaintext: they decide identity, they trust none.
IDENTITY_OF = {name: name for name in SERVICES} | {"router_http": "router"}


def identity(workload: str) -> str:
    return spiffe_id(LOCAL_NAMESPACE, workload)


def with_mesh_tls(layout: Layout) -> Layout:
    """`layout` with mTLS to every upstream (each checked for its own identity)."""
    upstreams = {
        name: replace(up, peer_identity=identity(IDENTITY_OF[name])) if name in IDENTITY_OF else up
        for name, up in layout.upstreams.items()
    }
    return replace(layout, mesh_tls=True, upstreams=upstreams)


def local_config(layout: Layout) -> Config:
    """bootstrap.local_config, secured when `layout.mesh_tls` (render and mesh-apply both)."""
    config = bootstrap.local_config(layout)
    if layout.mesh_tls:
        _secure_replica_cluster(config)
        _secure_mesh_listener(config)
    return config


def _secure_replica_cluster(config: Config) -> None:
    """The pinned-replica cluster (ORIGINAL_DST) speaks mTLS to inference replicas too."""
    for cluster in config["static_resources"]["clusters"]:
        if cluster["name"] == REPLICA_CLUSTER:
            cluster["transport_socket"] = upstream_tls(identity("inference"))


def _secure_mesh_listener(config: Config) -> None:
    """Only the router (its certificate) may call the mesh listener."""
    context: Config = {
        "require_client_certificate": True,
        "common_tls_context": {
            "alpn_protocols": ["h2"],
            "tls_params": {"tls_minimum_protocol_version": "TLSv1_2"},
            "tls_certificates": [
                {
                    "certificate_chain": {"filename": LISTENER_CERT},
                    "private_key": {"filename": LISTENER_KEY},
                }
            ],
            "validation_context": {
                "trusted_ca": {"filename": MESH_CA},
                "match_typed_subject_alt_names": [
                    {"san_type": "URI", "matcher": {"exact": identity("router")}}
                ],
            },
        },
    }
    socket = {
        "name": "envoy.transport_sockets.tls",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3"
            ".DownstreamTlsContext",
            **context,
        },
    }
    for listener in config["static_resources"]["listeners"]:
        if listener["name"] == MESH_LISTENER:
            for chain in listener["filter_chains"]:
                chain["transport_socket"] = socket
