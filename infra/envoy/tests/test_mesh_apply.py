"""Hot reload on a real Envoy: the rendered local flavour runs from filesystem xDS files,
`apply` swaps a changed policy in (read back from `/config_dump`), and a refused policy
leaves both the files and the running config as they were."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import yaml

from llm_envoy import apply, live, mesh_view, xds
from llm_envoy.layouts import LocalPorts
from llm_envoy.local_spec import LocalSpec
from llm_envoy.policy import DEFAULT_POLICY_FILE, PolicyError, load_policy, parse_policy
from llm_envoy.render import render_local_spec
from llm_envoy.validate import envoy_binary

from .conftest import PROTOS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class RunningEnvoy:
    workdir: Path
    admin: str


@pytest.fixture
def running_envoy(envoy_workdir: Path, tmp_path: Path) -> Iterator[RunningEnvoy]:
    workdir = tmp_path / "envoy"
    shutil.copytree(envoy_workdir / "certs", workdir / "certs")
    ports = replace(
        LocalPorts(),
        edge_http=_free_port(),
        edge_tls=_free_port(),
        admin=_free_port(),
        mesh=_free_port(),
    )
    spec = LocalSpec(ports)
    boot = render_local_spec(spec, workdir, PROTOS, load_policy())
    args = [str(envoy_binary()), "-c", str(boot), "--disable-hot-restart", "--log-level", "warn"]
    log = (workdir / "envoy.log").open("w")
    process = subprocess.Popen(args, cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_ready(spec.admin, process)
        yield RunningEnvoy(workdir, spec.admin)
    finally:
        process.terminate()
        process.wait(10)
        log.close()


def _wait_ready(admin: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, "envoy exited"
        try:
            if live.xds_state(admin, []).versions["lds"]:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("envoy did not load its xDS files")


CHANGED = """
version: 1
clusters:
  router: {circuit_breakers: {max_requests: 64}}
edge_routes:
  streaming: {retry: {num_retries: 1, backoff_base_s: 0.1, backoff_max_s: 1}}
"""


def test_a_changed_policy_goes_live_without_restart(
    running_envoy: RunningEnvoy, tmp_path: Path
) -> None:
    before = mesh_view.live_values(running_envoy.admin)
    assert before["clusters"]["router"]["max_requests"] == 1024
    policy = tmp_path / "policy.yaml"
    policy.write_text(CHANGED, encoding="utf-8")

    done = apply.apply(running_envoy.workdir, policy)

    after = mesh_view.live_values(running_envoy.admin)
    assert after["clusters"]["router"]["max_requests"] == 64
    assert after["clusters"]["cache"]["max_requests"] == 1024
    stream = after["routes"]["edge_http"]["ChatStream"]
    assert stream["num_retries"] == 1
    assert stream["backoff"] == {"base_interval": "0.100s", "max_interval": "1s"}
    assert after["routes"]["edge_http"]["CountTokens"]["num_retries"] == 2
    state = live.xds_state(running_envoy.admin, ["edge_http", "edge_https", "mesh"])
    assert state.all_at(done.version, ["cds", "rds:edge_http", "rds:edge_https"])
    assert done.version != done.previous
    # Listeners and the mesh's route table did not change: Envoy keeps them as they were
    # (no listener drain), under their old version.
    assert state.versions["lds"] == done.previous
    assert state.versions["rds:mesh"] == done.previous
    # Every route table still comes from its RDS file (none inlined into a listener).
    dump = live.config_dump(running_envoy.admin)
    routes = next(c for c in dump["configs"] if c["@type"].endswith(".RoutesConfigDump"))
    assert "static_route_configs" not in routes
    assert len(routes["dynamic_route_configs"]) == 4  # edge_http, edge_https, mesh, admin_read
    assert state.rejected == 0
    assert done.apply_s < 10


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ("edge_routes: {unary: {timeout_s: -2}}", "edge_routes.unary.timeout_s"),
        ("clusters: {defaults: {circuit_breakers: {retry_budget_percent: 101}}}", "retry_budget"),
        ("edge: {rate_limit: {timeuot_s: 1}}", "edge.rate_limit.timeuot_s: unknown key"),
    ],
)
def test_a_refused_policy_changes_nothing(
    running_envoy: RunningEnvoy, tmp_path: Path, bad: str, named: str
) -> None:
    files = {p.name: p.read_bytes() for p in (running_envoy.workdir / xds.XDS_DIR).iterdir()}
    version = live.xds_state(running_envoy.admin, []).versions["cds"]
    policy = tmp_path / "policy.yaml"
    policy.write_text(bad, encoding="utf-8")

    with pytest.raises(PolicyError, match=named):
        apply.apply(running_envoy.workdir, policy)

    after = {p.name: p.read_bytes() for p in (running_envoy.workdir / xds.XDS_DIR).iterdir()}
    assert after == files
    assert live.xds_state(running_envoy.admin, []).versions["cds"] == version


def test_reapplying_the_committed_policy_is_a_no_op(running_envoy: RunningEnvoy) -> None:
    version = live.xds_state(running_envoy.admin, []).versions["cds"]
    done = apply.apply(running_envoy.workdir, DEFAULT_POLICY_FILE)
    assert done.version == version


def test_show_prints_the_effective_policy_and_live_values(running_envoy: RunningEnvoy) -> None:
    """What `make mesh-show` prints reads back as the policy, next to what Envoy runs."""
    text = mesh_view.show_text(load_policy(), running_envoy.admin)
    shown = yaml.safe_load(text)
    assert parse_policy(shown["effective_policy"]) == load_policy()
    assert shown["live"]["clusters"]["router"]["max_requests"] == 1024
    assert shown["live"]["routes"]["mesh"]["cache"]["timeout"] == "1.500s"
