"""`mesh-apply`: a new policy live in a running Envoy, without a restart.

Check the policy (schema), render the whole config with it, have Envoy validate it
(`envoy --mode validate`), then rename the xDS files into place — clusters first, then
routes, then listeners, so nothing refers to a cluster Envoy does not have yet — and wait
until the admin reports the new version everywhere. A policy that fails any step is never
written; one that Envoy refuses at load time is rolled back to the previous files.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from llm_envoy import bootstrap, live, local_mtls, render, xds
from llm_envoy.local_spec import LocalSpec
from llm_envoy.policy import load_policy
from llm_envoy.validate import validate

CHECK_FILE = ".mesh-apply-check.yaml"
CONFIRM_TIMEOUT_S = 15.0
POLL_S = 0.1


class ApplyError(RuntimeError):
    """The policy was not applied; the running config is unchanged."""


@dataclass(frozen=True, slots=True)
class Applied:
    """What changed and how long Envoy took to report it."""

    version: str
    previous: str
    files: tuple[str, ...]
    validate_s: float
    apply_s: float  # first rename -> every xDS version reported live
    replaced_clusters: tuple[str, ...] = ()  # Envoy rebuilds these (warming, health checks)


def _order(names: list[str]) -> list[str]:
    """Clusters, then route tables, then listeners."""
    rds = sorted(n for n in names if n not in (xds.CDS_FILE, xds.LDS_FILE))
    return [xds.CDS_FILE, *rds, xds.LDS_FILE]


def _tables(split: xds.XdsConfig) -> list[str]:
    return [r["resources"][0]["name"] for n, r in split.files.items() if n.startswith("rds-")]


def rendered(workdir: Path, policy_file: Path) -> tuple[LocalSpec, xds.XdsConfig]:
    """The running directory's layout with the policy in `policy_file` (PolicyError if bad)."""
    spec = LocalSpec.read(workdir)
    policy = load_policy(policy_file)
    return spec, xds.split(local_mtls.local_config(spec.layout(policy)))


def _validate(split: xds.XdsConfig, workdir: Path) -> float:
    started = time.monotonic()
    check = workdir / CHECK_FILE
    check.write_text(bootstrap.to_yaml(xds.join(split), "mesh-apply check"), encoding="utf-8")
    try:
        verdict = validate(check, workdir)
    finally:
        check.unlink(missing_ok=True)
    if not verdict.ok:
        raise ApplyError(f"envoy --mode validate refused the config:\n{verdict.output[-3000:]}")
    return time.monotonic() - started


def _same_bootstrap(split: xds.XdsConfig, workdir: Path) -> None:
    running = yaml.safe_load((workdir / render.LOCAL_CONFIG).read_text(encoding="utf-8"))
    if running != split.bootstrap:
        raise ApplyError("the bootstrap changed (admin, node or runtime): restart Envoy instead")


def apply(workdir: Path, policy_file: Path) -> Applied:
    """Apply `policy_file` to the Envoy running in `workdir` (PolicyError, ApplyError)."""
    spec, split = rendered(workdir, policy_file)
    _same_bootstrap(split, workdir)
    validate_s = _validate(split, workdir)
    tables = _tables(split)
    before = live.xds_state(spec.admin, tables)
    previous = {n: (workdir / xds.XDS_DIR / n).read_text(encoding="utf-8") for n in split.files}
    expect = _changed(split, previous)
    header = render.GENERATED.format(command="local")
    started = time.monotonic()
    _swap(workdir, {n: bootstrap.to_yaml(r, header) for n, r in split.files.items()})
    try:
        _confirm(lambda: live.xds_state(spec.admin, tables), split.version, expect, before.rejected)
    except ApplyError:
        _swap(workdir, previous)
        raise
    return Applied(
        version=split.version,
        previous=before.versions.get("cds", ""),
        files=tuple(_order(list(split.files))),
        validate_s=validate_s,
        apply_s=time.monotonic() - started,
        replaced_clusters=_replaced_clusters(split, previous),
    )


def _replaced_clusters(split: xds.XdsConfig, previous: dict[str, str]) -> tuple[str, ...]:
    """Clusters whose settings change. Envoy builds a new cluster for each and swaps it in
    once warmed; a health-checked one starts with its hosts unhealthy until their first
    check passes, so a first check that times out (a busy upstream) leaves it without
    healthy hosts for an interval or two (envoyproxy/envoy#13070)."""
    old = yaml.safe_load(previous.get(xds.CDS_FILE) or "{}") or {}
    before = {c["name"]: c for c in old.get("resources", [])}
    after = split.files[xds.CDS_FILE]["resources"]
    return tuple(c["name"] for c in after if before.get(c["name"]) != c)


def _changed(split: xds.XdsConfig, previous: dict[str, str]) -> list[str]:
    """The subscriptions whose resources change ("cds", "lds", "rds:<table>"). Envoy keeps
    the old version on a resource set it already runs, so only these report the new one."""
    keys = []
    for name, response in split.files.items():
        old = yaml.safe_load(previous[name]) if previous.get(name) else {}
        if old.get("resources") == response["resources"]:
            continue
        if name == xds.CDS_FILE:
            keys.append("cds")
        elif name == xds.LDS_FILE:
            keys.append("lds")
        else:
            keys.append(f"rds:{response['resources'][0]['name']}")
    return keys


def _swap(workdir: Path, texts: dict[str, str]) -> None:
    for name in _order(list(texts)):
        render.write_atomically(workdir / xds.XDS_DIR / name, texts[name])


def _confirm(
    read: Callable[[], live.XdsState], version: str, expect: list[str], rejected_before: int
) -> None:
    deadline = time.monotonic() + CONFIRM_TIMEOUT_S
    state = read()
    while time.monotonic() < deadline:
        state = read()
        if state.rejected > rejected_before:
            raise ApplyError("Envoy rejected the update (see its log); previous files restored")
        if state.all_at(version, expect):
            return
        time.sleep(POLL_S)
    behind = {k: state.versions.get(k) for k in expect if state.versions.get(k) != version}
    raise ApplyError(
        f"Envoy did not report version {version} within {CONFIRM_TIMEOUT_S:g} s "
        f"(still at: {behind}); previous files restored"
    )
