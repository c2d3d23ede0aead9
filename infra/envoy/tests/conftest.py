"""Rendered configs in a working directory Envoy can validate them in (certs, descriptor)."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_envoy.certs import ensure_dev_pki
from llm_envoy.descriptor import build_descriptor
from llm_envoy.topology import DESCRIPTOR

REPO = Path(__file__).resolve().parents[3]
PROTOS = REPO / "protos"
K8S_ENVOY = REPO / "infra" / "k8s" / "base" / "envoy"


@pytest.fixture(scope="session")
def envoy_workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What Envoy opens at start: certs/, proto/llm.pb and logs/."""
    workdir = tmp_path_factory.mktemp("envoy")
    ensure_dev_pki(workdir / "certs", mesh_identity="spiffe://llm.local/ns/llm/sa/test")
    build_descriptor(PROTOS, workdir / DESCRIPTOR)
    (workdir / "logs").mkdir()
    return workdir
