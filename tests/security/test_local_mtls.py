"""Threat 7 (docs/security.md): on one host a service's gRPC port trusts identity headers from
any local caller. With GRPC_TLS_* set (llm_common.server_tls) the port demands a certificate
from the mesh's CA: a real Envoy presenting its mesh certificate (llm_envoy.clusters.upstream_tls,
as the mesh's clusters do) gets through, a local process calling the port directly — with
forged identity headers, over plaintext, over TLS without a certificate or with a certificate
from another CA — is refused."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llm_common.config import ConfigError
from llm_common.ports import free_port
from llm_common.server import ServiceSpec
from llm_common.server_tls import ServerTls
from llm_envoy import local_mtls
from llm_envoy.certs import DevPki, ensure_dev_pki
from llm_envoy.clusters import REPLICA_CLUSTER, upstream_tls
from llm_envoy.local_spec import LocalSpec
from llm_envoy.policy import load_policy
from llm_envoy.render import render_local_spec
from llm_envoy.validate import envoy_binary, validate
from llm_stack.catalogue import local_replicas
from llm_stack.config import free_ports
from llm_stack.mesh_pki import issue_mesh_certificates
from llm_testing import RunningServer, running_server, settings_for_tests

pytestmark = [pytest.mark.security, pytest.mark.integration]

REPO = Path(__file__).resolve().parents[2]
MODELS = "infra/config/models.yaml"
POLICY = "infra/envoy/policy.yaml"
IDENTITY = "spiffe://llm.local/ns/local/sa/stack"
FORGED = (("x-tenant-id", "victim"), ("x-key-id", "k-admin"), ("x-scopes", "admin"))
HEALTH = health_pb2.HealthCheckRequest()
ROUTER = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
HCM = (
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
    ".HttpConnectionManager"
)
HTTP2 = "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> DevPki:
    return ensure_dev_pki(tmp_path_factory.mktemp("envoy") / "certs", mesh_identity=IDENTITY)


@pytest.fixture
async def service(pki: DevPki) -> AsyncIterator[RunningServer]:
    """A health-only service whose port demands a mesh certificate."""
    tls = ServerTls(cert=pki.mesh_cert, key=pki.mesh_key, client_ca=pki.ca)
    settings = replace(settings_for_tests("mtls"), tls=tls)
    spec = ServiceSpec(service_names=(), register=lambda server: None)
    async with running_server(spec, settings=settings) as running:
        yield running


def envoy_config(listen: int, admin: int, upstream: int) -> dict[str, object]:
    route = {"match": {"prefix": "/"}, "route": {"cluster": "service"}}
    hcm = {
        "@type": HCM,
        "stat_prefix": "mesh",
        "codec_type": "AUTO",
        "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"], "routes": [route]}]},
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}],
    }
    endpoint = {"address": {"socket_address": {"address": "127.0.0.1", "port_value": upstream}}}
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin}}},
        "static_resources": {
            "listeners": [
                {
                    "name": "mesh",
                    "address": {"socket_address": {"address": "127.0.0.1", "port_value": listen}},
                    "filter_chains": [
                        {
                            "filters": [
                                {
                                    "name": "envoy.filters.network.http_connection_manager",
                                    "typed_config": hcm,
                                }
                            ]
                        }
                    ],
                }
            ],
            "clusters": [
                {
                    "name": "service",
                    "type": "STATIC",
                    "connect_timeout": "1s",
                    "typed_extension_protocol_options": {
                        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                            "@type": HTTP2,
                            "explicit_http_config": {"http2_protocol_options": {}},
                        }
                    },
                    "load_assignment": {
                        "cluster_name": "service",
                        "endpoints": [{"lb_endpoints": [{"endpoint": endpoint}]}],
                    },
                    "transport_socket": upstream_tls(IDENTITY),
                }
            ],
        },
    }


@pytest.fixture
def envoy(pki: DevPki, service: RunningServer) -> Iterator[int]:
    """A real Envoy in front of the service (cwd: the directory holding certs/); its port."""
    workdir = pki.directory.parent
    listen, admin = free_port(), free_port()
    (workdir / "envoy.json").write_text(json.dumps(envoy_config(listen, admin, service.port)))
    log = (workdir / "envoy.log").open("wb")
    argv = [str(envoy_binary()), "-c", "envoy.json", "--disable-hot-restart", "-l", "warn"]
    process = subprocess.Popen(argv, cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(process, admin)
        yield listen
    finally:
        process.terminate()
        process.wait(timeout=10)
        log.close()


def _wait_ready(process: subprocess.Popen[bytes], admin: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, "envoy exited"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin}/ready", timeout=1) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)  # a child process starting: there is no readiness event
    raise AssertionError("envoy did not become ready")


async def check(channel: grpc.aio.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    reply = await stub.Check(HEALTH, metadata=FORGED, timeout=3)
    return int(reply.status)


async def test_the_mesh_envoy_gets_through(envoy: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{envoy}") as channel:
        assert await check(channel) == health_pb2.HealthCheckResponse.SERVING


async def test_a_plaintext_local_caller_with_forged_headers_is_refused(
    service: RunningServer,
) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{service.port}") as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await check(channel)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_tls_without_a_mesh_certificate_is_refused(
    service: RunningServer, pki: DevPki, tmp_path: Path
) -> None:
    other = ensure_dev_pki(tmp_path / "other", mesh_identity=IDENTITY)  # another CA
    attempts = {
        "no client certificate": grpc.ssl_channel_credentials(pki.ca.read_bytes()),
        "another CA's certificate": grpc.ssl_channel_credentials(
            pki.ca.read_bytes(), other.mesh_key.read_bytes(), other.mesh_cert.read_bytes()
        ),
    }
    options = [("grpc.ssl_target_name_override", "mesh")]
    for name, credentials in attempts.items():
        target = f"127.0.0.1:{service.port}"
        async with grpc.aio.secure_channel(target, credentials, options=options) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await check(channel)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, name


def test_tls_settings_come_in_threes(pki: DevPki) -> None:
    assert ServerTls.from_env({}) is None
    with pytest.raises(ConfigError, match="GRPC_TLS_CLIENT_CA_FILE"):
        ServerTls.from_env(
            {"GRPC_TLS_CERT_FILE": str(pki.mesh_cert), "GRPC_TLS_KEY_FILE": str(pki.mesh_key)}
        )
    full = {
        "GRPC_TLS_CERT_FILE": str(pki.mesh_cert),
        "GRPC_TLS_KEY_FILE": str(pki.mesh_key),
        "GRPC_TLS_CLIENT_CA_FILE": str(pki.ca),
    }
    assert ServerTls.from_env(full) == ServerTls(pki.mesh_cert, pki.mesh_key, pki.ca)


def test_the_local_mesh_tls_render_is_valid_envoy_config(tmp_path: Path) -> None:
    """MESH_MTLS=1's one-host config: mTLS to every service port (each checked for its own
    identity) and to pinned replicas, the mesh listener demands the router's certificate,
    auth's own listeners for Envoy stay plaintext; Envoy accepts the whole config."""
    ports = free_ports(tuple(r.port for r in local_replicas(REPO / MODELS))).envoy
    workdir = tmp_path / "envoy"
    pki = issue_mesh_certificates(
        ensure_dev_pki(workdir / "certs", mesh_identity=IDENTITY), tmp_path / "mesh"
    )
    assert oct(pki.tls_for("cache").key.stat().st_mode & 0o777) == "0o600"
    spec = LocalSpec(ports, mesh_tls=True)
    config = local_mtls.local_config(spec.layout(load_policy(REPO / POLICY)))
    clusters = {c["name"]: c for c in config["static_resources"]["clusters"]}
    for name in ("auth", "tokenizer", "cache", "billing", "inference", "router_http"):
        tls = clusters[name]["transport_socket"]["typed_config"]["common_tls_context"]
        (san,) = tls["validation_context"]["match_typed_subject_alt_names"]
        expected = "router" if name == "router_http" else name
        assert san["matcher"]["exact"] == f"spiffe://llm.local/ns/local/sa/{expected}"
    assert "transport_socket" in clusters[REPLICA_CLUSTER]
    assert "transport_socket" not in clusters["auth_edge"]
    (mesh,) = [x for x in config["static_resources"]["listeners"] if x["name"] == "mesh_outbound"]
    downstream = mesh["filter_chains"][0]["transport_socket"]["typed_config"]
    assert downstream["require_client_certificate"] is True
    render_local_spec(spec, workdir, REPO / "protos", load_policy(REPO / POLICY))
    assert LocalSpec.read(workdir).mesh_tls  # `make mesh-apply` keeps it
    joined = workdir / "check.json"
    joined.write_text(json.dumps(config))
    verdict = validate(joined, workdir)  # Envoy's own --mode validate
    assert verdict.ok, verdict.output
