"""The service images (one target each in infra/docker/Dockerfile) start their processes with
the platform's gRPC runtime settings, on their mesh ports, as the non-root user.

Docker need not be installed: the template is parsed here, each target's settings resolved
through the stages it is built FROM, as Docker would inherit them."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from llm_common.grpc_runtime import GRPC_RUNTIME_ENV
from llm_envoy.topology import SERVICES

REPO = Path(__file__).resolve().parents[2]
TEMPLATE = REPO / "infra" / "docker" / "Dockerfile"


@dataclass
class Stage:
    """One `FROM ... AS name` stage: its own instructions, not yet its parent's."""

    name: str
    parent: str
    instructions: list[tuple[str, str]] = field(default_factory=list)


def parse_stages(text: str) -> dict[str, Stage]:
    """Stages by name (continuation lines joined, comments dropped)."""
    stages: dict[str, Stage] = {}
    current: Stage | None = None
    for raw in text.replace("\\\n", " ").splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        op, _, rest = line.partition(" ")
        if current is None and op.upper() == "ARG":
            continue  # a global build argument (BASE_IMAGE), used in FROM lines
        if op.upper() == "FROM":
            words = rest.split()
            assert len(words) == 3, f"unnamed stage: {line}"
            assert words[1].upper() == "AS", f"unnamed stage: {line}"
            current = stages[words[2]] = Stage(words[2], words[0])
        else:
            assert current is not None, f"instruction before FROM: {line}"
            current.instructions.append((op.upper(), rest.strip()))
    return stages


def lineage(stages: dict[str, Stage], target: str) -> list[Stage]:
    """The target and the stages it is built FROM, base first."""
    chain = [stages[target]]
    while chain[0].parent in stages:
        chain.insert(0, stages[chain[0].parent])
    return chain


@dataclass
class Image:
    env: dict[str, str]
    exposed: set[int]
    user: str | None
    entrypoint: list[str] | None
    healthcheck: str | None
    copied_from: list[str]


def image(stages: dict[str, Stage], target: str) -> Image:
    result = Image({}, set(), None, None, None, [])
    for stage in lineage(stages, target):
        for op, rest in stage.instructions:
            if op == "ENV":
                pairs = (word.split("=", 1) for word in shlex.split(rest))
                result.env |= {key: value for key, value in pairs}
            elif op == "EXPOSE":
                result.exposed |= {int(port) for port in rest.split()}
            elif op == "USER":
                result.user = rest
            elif op == "ENTRYPOINT":
                result.entrypoint = json.loads(rest)
            elif op == "HEALTHCHECK":
                result.healthcheck = rest
            elif op == "COPY" and rest.startswith("--from="):
                result.copied_from.append(rest.split()[0].removeprefix("--from="))
    return result


@pytest.fixture(scope="module")
def stages() -> dict[str, Stage]:
    return parse_stages(TEMPLATE.read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", list(SERVICES))
def test_every_service_has_a_target_with_its_ports_and_entrypoint(
    stages: dict[str, Stage], name: str
) -> None:
    info = SERVICES[name]
    built = image(stages, name)
    assert {k: built.env.get(k) for k in GRPC_RUNTIME_ENV} == dict(GRPC_RUNTIME_ENV)
    assert built.env["GRPC_PORT"] == str(info.grpc_port)
    assert built.env["METRICS_PORT"] == str(info.metrics_port)
    assert built.exposed == {info.grpc_port, info.metrics_port}
    assert built.entrypoint == [f"/opt/venv/bin/llm-{name}"]
    assert built.user == "1000"
    assert built.healthcheck is not None
    assert "llm_common.healthcheck" in built.healthcheck
    assert built.copied_from == [f"{name}-build"]


@pytest.mark.parametrize("name", list(SERVICES))
def test_each_build_stage_installs_its_own_service_only(
    stages: dict[str, Stage], name: str
) -> None:
    build = stages[f"{name}-build"]
    commands = " ".join(rest for op, rest in build.instructions if op == "RUN")
    installed = {word for word in commands.split() if word.startswith("services/")}
    assert installed == {f"services/{name}"}


def test_per_service_differences_are_kept(stages: dict[str, Stage]) -> None:
    assert image(stages, "cache").env["HF_HUB_OFFLINE"] == "1"
    router = image(stages, "router")
    assert router.env["ROUTER_OUTBOX_DIR"] == "/var/lib/llm-router"
    assert ("VOLUME", "/var/lib/llm-router") in stages["router"].instructions
    assert ("CMD", '["serve"]') in stages["inference"].instructions
    assert image(stages, "inference").env["OMP_WAIT_POLICY"] == "PASSIVE"
    for name in ("tokenizer", "inference"):
        assert image(stages, name).env["MODEL_ROOT"] == "/models"
    config = {
        name
        for name, stage in stages.items()
        if ("COPY", "infra/config /etc/llmapi") in stage.instructions
    }
    assert config == set(SERVICES) - {"cache"}


def test_compose_builds_each_service_from_its_target() -> None:
    compose = yaml.safe_load((REPO / "infra" / "compose.yaml").read_text(encoding="utf-8"))
    targets: dict[str, str] = {}
    for service in compose["services"].values():
        build = service.get("build")
        if isinstance(build, dict) and "target" in build:
            assert build["dockerfile"] == "infra/docker/Dockerfile"
            assert service["image"] == f"llm-{build['target']}"
            targets[build["target"]] = service["image"]
    assert set(targets) == {*SERVICES, "envoy"}


def test_no_service_keeps_its_own_dockerfile() -> None:
    assert sorted(REPO.glob("services/*/Dockerfile")) == []


def test_the_base_image_is_a_build_argument_with_the_official_default() -> None:
    text = TEMPLATE.read_text(encoding="utf-8")
    assert "ARG BASE_IMAGE=python:3.11-slim" in text
    froms = [line.split()[1] for line in text.splitlines() if line.startswith("FROM ")]
    assert all(f == "${BASE_IMAGE}" or f in parse_stages(text) for f in froms), froms


def test_no_build_step_downloads(stages: dict[str, Stage]) -> None:
    """Every install reads the wheelhouse (or the copied source) only: --no-index."""
    for stage in stages.values():
        for op, rest in stage.instructions:
            if op == "RUN" and "pip install" in rest:
                assert rest.count("pip install") == rest.count("--no-index"), rest


@pytest.mark.parametrize("name", list(SERVICES))
def test_the_dependency_layer_comes_before_the_code(stages: dict[str, Stage], name: str) -> None:
    """Dependencies are installed from the pyproject files alone; the code is copied after,
    so a code change leaves the dependency layer cached."""
    build = stages[f"{name}-build"].instructions
    runs = [(i, rest) for i, (op, rest) in enumerate(build) if op == "RUN"]
    deps = next(i for i, rest in runs if "--no-deps" not in rest)
    code = next(i for i, rest in runs if "--no-deps" in rest)
    assert deps < code
    # The code reaches the build only through the code layer's bind mounts.
    assert f"source=services/{name},target=/src/services/{name}" in build[code][1]
    copied = [rest for op, rest in build if op == "COPY"]
    assert all("pyproject.toml" in rest for rest in copied)


def test_the_envoy_image_runs_the_wheel_binary_as_non_root(stages: dict[str, Stage]) -> None:
    envoy = image(stages, "envoy")
    assert envoy.user == "101"
    assert envoy.entrypoint == ["/usr/local/bin/envoy"]
    assert envoy.copied_from == ["envoy-build"]
    assert envoy.healthcheck is not None
