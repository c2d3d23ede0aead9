"""Every rendered config passes `envoy --mode validate`, and the committed Kubernetes files
are exactly what the renderer produces."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from llm_envoy import bootstrap, layouts, render, xds
from llm_envoy.descriptor import build_descriptor
from llm_envoy.topology import AUTH_EDGE_PORT, AUTH_HTTP_PORT, SERVICES, Endpoint
from llm_envoy.validate import validate

from .conftest import K8S_ENVOY, PROTOS


def check(config_text: str, workdir: Path, name: str) -> None:
    path = workdir / name
    path.write_text(config_text, encoding="utf-8")
    verdict = validate(path, workdir)
    assert verdict.ok, verdict.output[-3000:]
    assert "Deprecated field" not in verdict.output, verdict.output[-3000:]


LOCAL_PORTS = {
    "main-port": layouts.LocalPorts(),
    "auth-listeners": layouts.LocalPorts(auth_edge=AUTH_EDGE_PORT, auth_http=AUTH_HTTP_PORT),
}


@pytest.mark.parametrize("ports", list(LOCAL_PORTS))
@pytest.mark.parametrize("otlp", [None, Endpoint("127.0.0.1", 4317)], ids=["plain", "traced"])
def test_local_flavour_validates(envoy_workdir: Path, otlp: Endpoint | None, ports: str) -> None:
    """The bootstrap and, joined back into one file, the xDS files render_local wrote
    (validation mode does not read xDS files itself)."""
    layout = layouts.local_layout(LOCAL_PORTS[ports], otlp=otlp)
    boot = render.render_local(layout, envoy_workdir, PROTOS)
    assert validate(boot, envoy_workdir).ok
    files = {
        p.name: yaml.safe_load(p.read_text()) for p in (envoy_workdir / xds.XDS_DIR).glob("*.yaml")
    }
    joined = xds.join(xds.XdsConfig(yaml.safe_load(boot.read_text()), files))
    assert joined == bootstrap.local_config(layout)
    check(bootstrap.to_yaml(joined, "joined"), envoy_workdir, f"joined-{ports}.yaml")


BOOTSTRAPS = sorted(n for n in render.k8s_files() if "/" not in n)


@pytest.mark.parametrize("name", BOOTSTRAPS)
def test_kubernetes_flavour_validates(envoy_workdir: Path, name: str) -> None:
    """Each bootstrap; for the Envoys on xDS files, also the config they add up to."""
    files = render.k8s_files()
    check(files[name], envoy_workdir, name)
    if name in render.XDS_ENVOYS:
        folder = render.xds_configmap_dir(render.XDS_ENVOYS[name]) + "/"
        xds_files = {
            n.removeprefix(folder): yaml.safe_load(t)
            for n, t in files.items()
            if n.startswith(folder)
        }
        joined = xds.join(xds.XdsConfig(yaml.safe_load(files[name]), xds_files))
        check(bootstrap.to_yaml(joined, "joined"), envoy_workdir, f"joined-{name}")


@pytest.mark.parametrize("name", sorted(render.k8s_files()))
def test_committed_kubernetes_files_are_current(name: str) -> None:
    committed = K8S_ENVOY / name
    assert committed.is_file(), f"missing {committed}: run `python -m llm_envoy k8s`"
    assert committed.read_text(encoding="utf-8") == render.k8s_files()[name], (
        f"{committed} is stale: run `python -m llm_envoy k8s`"
    )


def test_committed_descriptor_is_current(tmp_path: Path) -> None:
    fresh = build_descriptor(PROTOS, tmp_path / "llm.pb")
    assert (K8S_ENVOY / render.K8S_DESCRIPTOR).read_bytes() == fresh.read_bytes()


def test_a_broken_config_is_rejected(envoy_workdir: Path) -> None:
    config = bootstrap.local_config(layouts.local_layout(layouts.LocalPorts()))
    config["static_resources"]["clusters"][0]["lb_policy"] = "NO_SUCH_POLICY"
    path = envoy_workdir / "broken.yaml"
    path.write_text(bootstrap.to_yaml(config, "broken on purpose"), encoding="utf-8")
    verdict = validate(path, envoy_workdir)
    assert not verdict.ok
    assert "NO_SUCH_POLICY" in verdict.output


def test_one_sidecar_per_service() -> None:
    names = set(BOOTSTRAPS)
    assert names == {render.K8S_EDGE, *(render.sidecar_file(s) for s in SERVICES)}


def test_split_and_join_are_inverse_and_join_leaves_the_split_alone() -> None:
    static = bootstrap.local_config(layouts.local_layout(layouts.LocalPorts()))
    split = xds.split(static)
    files = copy.deepcopy(split.files)
    assert xds.join(split) == static
    assert split.files == files  # validating the joined form must not inline the routes
    listeners = split.files[xds.LDS_FILE]["resources"]
    hcms = [lis["filter_chains"][0]["filters"][0]["typed_config"] for lis in listeners]
    assert all("rds" in h and "route_config" not in h for h in hcms)
