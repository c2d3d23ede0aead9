"""The Kubernetes manifests: schema-valid (kubernetes-validate, strict), and consistent with the
services' ports and settings, the mesh's configs and each other."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from llm_common.models_config import load_catalog
from llm_envoy.layouts import k8s_peers
from llm_envoy.render import sidecar_file
from llm_envoy.topology import MESH_INBOUND_PORT, MESH_OUTBOUND_PORT, SERVICES

REPO = Path(__file__).resolve().parents[3]
K8S = REPO / "infra" / "k8s"
BASE = K8S / "base"
OVERLAYS = ("dev", "prod", "gpu")
KUBERNETES_VERSION = "1.32.0"  # native sidecars (initContainers with restartPolicy) need 1.29+
CRD_GROUPS = ("cert-manager.io/",)
Manifest = dict[str, Any]


def documents(path: Path) -> list[Manifest]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]


def patch_files() -> set[Path]:
    """Strategic-merge patches: partial objects, validated once their overlay is built."""
    found = set()
    for kustomization in K8S.rglob("kustomization.yaml"):
        for patch in yaml.safe_load(kustomization.read_text()).get("patches", []):
            if "path" in patch:
                found.add((kustomization.parent / patch["path"]).resolve())
    return found


def manifest_files() -> Iterator[Path]:
    patches = patch_files()
    for path in sorted(K8S.rglob("*.yaml")):
        if path.resolve() in patches:
            continue
        if "envoy" in path.parts or "config" in path.parts or path.name == "models.yaml":
            continue  # Envoy bootstrap and platform config files, not Kubernetes objects
        if path.name == "kustomization.yaml" or path.parent.name == "tests":
            continue
        yield path


def validate(manifest: Manifest) -> None:
    if manifest["apiVersion"].startswith(CRD_GROUPS):
        return  # custom resources: no schema offline
    kubernetes_validate.validate(manifest, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("path", list(manifest_files()), ids=lambda p: str(p.relative_to(K8S)))
def test_every_resource_file_is_schema_valid(path: Path) -> None:
    docs = documents(path)
    assert docs
    for manifest in docs:
        if manifest.get("kind") in ("StatefulSet", "Deployment") and "spec" not in manifest.get(
            "spec", {}
        ).get("template", {}):
            continue  # a strategic-merge patch, validated after the overlay is built
        validate(manifest)


def kustomizations() -> list[Path]:
    return sorted(K8S.rglob("kustomization.yaml"))


@pytest.mark.parametrize("path", kustomizations(), ids=lambda p: str(p.parent.relative_to(K8S)))
def test_every_file_a_kustomization_names_exists(path: Path) -> None:
    spec = yaml.safe_load(path.read_text())
    named = [*spec.get("resources", []), *spec.get("components", [])]
    named += [p["path"] for p in spec.get("patches", []) if "path" in p]
    for generator in spec.get("configMapGenerator", []):
        named += generator.get("files", [])
    for entry in named:
        assert (path.parent / entry).exists(), f"{path}: {entry} does not exist"


def base_objects() -> dict[tuple[str, str], Manifest]:
    found = {}
    for path in sorted(BASE.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            for manifest in documents(path):
                found[(manifest["kind"], manifest["metadata"]["name"])] = manifest
    return found


OBJECTS = base_objects()


def workload(name: str) -> Manifest:
    return OBJECTS.get(("StatefulSet", name)) or OBJECTS[("Deployment", name)]


def container(name: str) -> Manifest:
    (app,) = workload(name)["spec"]["template"]["spec"]["containers"]
    return dict(app)


def env(name: str) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(name)["env"]}


def port(c: Manifest, port_name: str) -> int:
    return int(next(p["containerPort"] for p in c["ports"] if p["name"] == port_name))


@pytest.mark.parametrize("name", list(SERVICES))
def test_one_file_per_service_with_account_workload_and_service(name: str) -> None:
    kinds = {m["kind"] for m in documents(BASE / f"{name}.yaml")}
    assert kinds == {
        "ServiceAccount",
        "Service",
        "StatefulSet" if name == "inference" else "Deployment",
    }
    assert workload(name)["spec"]["template"]["spec"]["serviceAccountName"] == name
    assert OBJECTS[("ServiceAccount", name)]["automountServiceAccountToken"] is False


def default_ports(name: str) -> tuple[int, int]:
    """The service's own defaults (its config module), when its package is installed."""
    module = f"llm_{name}.config"
    if importlib.util.find_spec(f"llm_{name}") is None:
        info = SERVICES[name]
        return info.grpc_port, info.metrics_port
    config = __import__(module, fromlist=["DEFAULT_GRPC_PORT"])
    return int(config.DEFAULT_GRPC_PORT), int(config.DEFAULT_METRICS_PORT)


@pytest.mark.parametrize("name", list(SERVICES))
def test_ports_agree_everywhere(name: str) -> None:
    app = container(name)
    grpc_port, metrics_port = default_ports(name)
    assert grpc_port == SERVICES[name].grpc_port  # the mesh renderer's view
    assert port(app, "grpc") == grpc_port == int(env(name)["GRPC_PORT"])
    assert app["readinessProbe"]["grpc"]["port"] == grpc_port
    assert app["livenessProbe"]["grpc"]["port"] == grpc_port
    assert port(app, "metrics") == metrics_port == int(env(name)["METRICS_PORT"])
    annotations = workload(name)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(metrics_port)
    service = OBJECTS[("Service", name)]
    assert service["spec"]["clusterIP"] == "None"  # headless: Envoy balances per request
    ports = {p["name"]: p for p in service["spec"]["ports"]}
    assert ports["grpc"]["port"] == grpc_port
    assert ports["mesh"]["port"] == MESH_INBOUND_PORT


@pytest.mark.parametrize("name", list(SERVICES))
def test_sidecar_runs_this_service_s_envoy_config(name: str) -> None:
    (sidecar,) = workload(name)["spec"]["template"]["spec"]["initContainers"]
    assert sidecar["restartPolicy"] == "Always"  # native sidecar: up before, down after the app
    config = sidecar["args"][sidecar["args"].index("-c") + 1]
    assert config == f"/etc/envoy/config/{sidecar_file(name)}"
    assert port(sidecar, "mesh") == MESH_INBOUND_PORT
    kustomization = yaml.safe_load((BASE / "kustomization.yaml").read_text())
    envoy_files = next(
        g["files"] for g in kustomization["configMapGenerator"] if g["name"] == "envoy-config"
    )
    assert f"envoy/{sidecar_file(name)}" in envoy_files
    volumes = {v["name"]: v for v in workload(name)["spec"]["template"]["spec"]["volumes"]}
    (source,) = volumes["mesh-certs"]["projected"]["sources"]
    assert source["secret"]["name"] == f"mesh-tls-{name}"  # its own SPIFFE identity


@pytest.mark.parametrize("name", [*SERVICES, "gateway"])
def test_containers_are_locked_down_and_bounded(name: str) -> None:
    spec = workload(name)["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    for c in [*spec.get("initContainers", []), *spec["containers"]]:
        security = c["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert {"cpu", "memory"} <= set(c["resources"]["requests"])
        assert {"cpu", "memory"} <= set(c["resources"]["limits"])


def _source_mentions(name: str, variable: str) -> bool:
    """Whether the service (or llm_common) names `variable`; `X_FILE` counts when X does and
    the service reads secrets from `<NAME>_FILE` files."""
    roots = [REPO / "libs" / "llm-common" / "src", REPO / "services" / name / "src"]
    sources = [p.read_text() for r in roots for p in r.rglob("*.py")]
    if any(f'"{variable}"' in text for text in sources):
        return True
    base = variable.removesuffix("_FILE")
    return base != variable and any(f'"{base}"' in t and '_FILE"' in t for t in sources)


@pytest.mark.parametrize("name", list(SERVICES))
def test_every_environment_variable_is_one_the_service_reads(name: str) -> None:
    if not (REPO / "services" / name / "src").is_dir():
        pytest.skip(f"services/{name} is not in this checkout")
    generic = {"OMP_NUM_THREADS", "ROUTER_HTTP_PORT"}  # torch's; the router's HTTP listener
    unknown = [v for v in env(name) if v not in generic and not _source_mentions(name, v)]
    assert not unknown, f"{name} does not read {unknown}"


def test_router_reaches_its_dependencies_through_the_outbound_mesh() -> None:
    variables = env("router")
    mesh = f"127.0.0.1:{MESH_OUTBOUND_PORT}"
    for variable in (
        "TOKENIZER_SERVICE_ADDR",
        "CACHE_SERVICE_ADDR",
        "BILLING_SERVICE_ADDR",
        "AUTH_SERVICE_ADDR",
        "INFERENCE_MESH_ADDR",
    ):
        assert variables[variable] == mesh
    # Envoy retries those hops; gRPC must not retry them again.
    assert variables["ROUTER_CHANNEL_RETRIES"] == "false"


def test_catalogues_list_the_statefulset_pods_on_their_mesh_port(tmp_path: Path) -> None:
    local = load_catalog(REPO / "infra" / "config" / "models.yaml", tmp_path)
    for path, count in (
        (BASE / "config" / "models.yaml", 2),
        (K8S / "overlays/dev/models.yaml", 1),
    ):
        catalog = load_catalog(path, tmp_path)
        spec = catalog.resolve("demo-llama")
        assert spec is not None
        assert spec.aliases == local.models["demo-llama"].aliases
        replicas = [r for d in spec.deployments for r in d.replicas]
        assert replicas == [
            f"inference-{i}.inference.llm.svc.cluster.local:{MESH_INBOUND_PORT}"
            for i in range(count)
        ]


def test_prod_finds_inference_pods_by_dns_not_by_a_pod_list(tmp_path: Path) -> None:
    spec = load_catalog(K8S / "overlays/prod/models.yaml", tmp_path).resolve("demo-llama")
    assert spec is not None
    (deployment,) = spec.deployments
    assert deployment.replicas == ()
    found = deployment.discovery
    assert (found.kind, found.port) == ("dns", MESH_INBOUND_PORT)
    # The headless Service of the inference StatefulSet, which publishes ready pods only.
    service = next(m for m in documents(BASE / "inference.yaml") if m["kind"] == "Service")
    assert found.service == f"{service['metadata']['name']}.llm.svc.cluster.local"
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is False


@pytest.mark.parametrize("name", ["prices.yaml", "policies.yaml"])
def test_platform_config_copies_match_the_originals(name: str) -> None:
    assert (BASE / "config" / name).read_text() == (REPO / "infra" / "config" / name).read_text()


def prod(kind: str) -> list[Manifest]:
    found = []
    for path in (K8S / "overlays" / "prod").glob("*.yaml"):
        if path.name not in ("kustomization.yaml", "models.yaml"):
            found += [m for m in documents(path) if m["kind"] == kind]
    return found


def test_inference_scales_on_queue_depth() -> None:
    hpa = next(h for h in prod("HorizontalPodAutoscaler") if h["metadata"]["name"] == "inference")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": "inference",
    }
    names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]]
    assert names == ["llm_inference_queue_depth", "llm_inference_kv_cache_usage"]
    rules = yaml.safe_load((REPO / "infra/prometheus/adapter-rules.yaml").read_text())["rules"]
    sources = {r["name"]["as"]: r["name"]["matches"] for r in rules}
    # Each from a gauge every replica exports (llm_inference.metrics).
    assert sources == {
        "llm_inference_queue_depth": "^vllm:num_requests_waiting$",
        "llm_inference_kv_cache_usage": "^vllm:kv_cache_usage_perc$",
    }
    assert hpa["spec"]["maxReplicas"] == 8


def test_every_workload_has_a_disruption_budget() -> None:
    budgets = {
        p["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
        for p in prod("PodDisruptionBudget")
    }
    assert budgets == {*SERVICES, "gateway"}


def test_network_policies_admit_exactly_the_mesh_peers() -> None:
    policies = {p["metadata"]["name"]: p for p in prod("NetworkPolicy")}
    assert policies["default-deny-ingress"]["spec"]["podSelector"] == {}
    for name in SERVICES:
        policy = next(
            p
            for p in policies.values()
            if p["spec"]["podSelector"].get("matchLabels", {}).get("app.kubernetes.io/name") == name
        )
        (rule,) = policy["spec"]["ingress"]
        sources = {f["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for f in rule["from"]}
        assert sources == set(k8s_peers(name)), name  # the same callers the sidecar's RBAC allows
        assert [p["port"] for p in rule["ports"]] == [MESH_INBOUND_PORT]


def kustomize(overlay: str) -> list[Manifest]:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    done = subprocess.run(
        [kubectl, "kustomize", str(K8S / "overlays" / overlay)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlays_build_into_valid_manifests(overlay: str) -> None:
    built = kustomize(overlay)
    for manifest in built:
        validate(manifest)
        assert (
            manifest["metadata"].get("namespace", "llm") == "llm" or manifest["kind"] == "Namespace"
        )
    names = {(m["kind"], m["metadata"]["name"]) for m in built}
    assert ("Deployment", "gateway") in names
    assert ("StatefulSet", "inference") in names


def test_the_gpu_overlay_runs_tensorrt_llm_on_a_gpu() -> None:
    built = kustomize("gpu")
    inference = next(
        m for m in built if m["kind"] == "StatefulSet" and m["metadata"]["name"] == "inference"
    )
    (app,) = inference["spec"]["template"]["spec"]["containers"]
    variables = {e["name"]: e.get("value") for e in app["env"]}
    assert variables["INFERENCE_BACKEND"] == "tensorrt_llm"
    assert [e["name"] for e in app["env"]].count("INFERENCE_BACKEND") == 1
    assert app["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert re.fullmatch(r"llm-inference-gpu(:.+)?", app["image"])
