"""The service images start their processes with the platform's gRPC runtime settings."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from llm_common.grpc_runtime import GRPC_RUNTIME_ENV
from llm_envoy.topology import SERVICES

REPO = Path(__file__).resolve().parents[2]


def image_env(dockerfile: Path) -> dict[str, str]:
    """Every `ENV K=V ...` of the final stage (continuation lines joined)."""
    text = dockerfile.read_text(encoding="utf-8").replace("\\\n", " ")
    final = text.rsplit("\nFROM ", 1)[-1]
    env: dict[str, str] = {}
    for line in final.splitlines():
        if line.startswith("ENV "):
            pairs = (word.split("=", 1) for word in shlex.split(line[4:]))
            env |= {key: value for key, value in pairs}
    return env


@pytest.mark.parametrize("name", list(SERVICES))
def test_every_image_sets_the_grpc_runtime(name: str) -> None:
    dockerfile = REPO / "services" / name / "Dockerfile"
    if not dockerfile.is_file():
        pytest.skip(f"services/{name} has no Dockerfile in this checkout")
    env = image_env(dockerfile)
    assert {k: env.get(k) for k in GRPC_RUNTIME_ENV} == dict(GRPC_RUNTIME_ENV)
    assert "GRPC_PORT" in env  # the parser read the service's own ENV line too
