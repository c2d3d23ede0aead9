"""The gateway's and the router sidecar's xDS files reach Envoy through ConfigMaps that
`kubectl apply` updates in place: every rendered file is in its ConfigMap, the ConfigMap has
no hash suffix (its name stays, so the mounted files are swapped, not the pods), it is
mounted as a directory at the path the bootstrap watches, and the built overlay agrees."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_envoy import render, xds

REPO = Path(__file__).resolve().parents[3]
BASE = REPO / "infra" / "k8s" / "base"
MOUNT = "/etc/envoy/xds"
WORKLOADS = {render.K8S_EDGE: "gateway", "sidecar-router.yaml": "router"}


def _generator(name: str) -> dict[str, Any]:
    spec = yaml.safe_load((BASE / "kustomization.yaml").read_text(encoding="utf-8"))
    found: dict[str, Any] = next(g for g in spec["configMapGenerator"] if g["name"] == name)
    return found


@pytest.mark.parametrize("bootstrap", sorted(render.XDS_ENVOYS))
def test_every_xds_file_is_in_an_unsuffixed_configmap(bootstrap: str) -> None:
    folder = render.xds_configmap_dir(render.XDS_ENVOYS[bootstrap])
    rendered = {n for n in render.k8s_files() if n.startswith(f"{folder}/")}
    generator = _generator(f"envoy-{folder}")
    assert {f.removeprefix("envoy/") for f in generator["files"]} == rendered
    assert generator["options"]["disableNameSuffixHash"] is True


@pytest.mark.parametrize("bootstrap", sorted(render.XDS_ENVOYS))
def test_the_bootstrap_watches_the_mounted_directory(bootstrap: str) -> None:
    config = yaml.safe_load(render.k8s_files()[bootstrap])
    source = config["dynamic_resources"]["cds_config"]["path_config_source"]
    assert source == {
        "path": f"{xds.XDS_DIR}/{xds.CDS_FILE}",
        "watched_directory": {"path": xds.XDS_DIR},
    }
    docs = yaml.safe_load_all((BASE / f"{WORKLOADS[bootstrap]}.yaml").read_text())
    manifest = next(d for d in docs if d and d["kind"] in ("Deployment", "StatefulSet"))
    pod = manifest["spec"]["template"]["spec"]
    envoy = next(
        c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == "envoy"
    )
    assert envoy["workingDir"] == MOUNT.removesuffix(f"/{xds.XDS_DIR}")
    mount = next(m for m in envoy["volumeMounts"] if m["name"] == "envoy-xds")
    assert mount["mountPath"] == MOUNT
    assert "subPath" not in mount  # subPath mounts never see ConfigMap updates
    volume = next(v for v in pod["volumes"] if v["name"] == "envoy-xds")
    folder = render.xds_configmap_dir(render.XDS_ENVOYS[bootstrap])
    assert volume["configMap"]["name"] == f"envoy-{folder}"


def test_the_built_overlay_keeps_the_xds_configmap_names() -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (with its built-in kustomize) is not installed")
    built = subprocess.run(
        [kubectl, "kustomize", str(BASE)], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    maps = {
        d["metadata"]["name"] for d in yaml.safe_load_all(built) if d and d["kind"] == "ConfigMap"
    }
    assert {"envoy-xds-edge", "envoy-xds-router"} <= maps
    assert any(m.startswith("envoy-config-") for m in maps)  # the bootstrap rolls the pods
