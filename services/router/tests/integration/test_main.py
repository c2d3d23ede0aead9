"""`python -m llm_router`: a configuration problem is one clear line and exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
BASE = {
    "TOKENIZER_SERVICE_ADDR": "127.0.0.1:1",
    "BILLING_SERVICE_ADDR": "127.0.0.1:1",
    "AUTH_SERVICE_ADDR": "off",
    "CACHE_SERVICE_ADDR": "off",
    "GRPC_PORT": "0",
    "METRICS_PORT": "off",
}


def run(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **BASE, "ROUTER_OUTBOX_DIR": str(tmp_path / "outbox"), **env}
    full = {k: v for k, v in full.items() if v != "<unset>"}
    return subprocess.run(
        [sys.executable, "-m", "llm_router"],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"TOKENIZER_SERVICE_ADDR": "<unset>"}, "TOKENIZER_SERVICE_ADDR: is required"),
        ({"ROUTER_BALANCER": "random"}, "ROUTER_BALANCER"),
        ({"ROUTER_POLICIES": "/nonexistent/policies.yaml"}, "ROUTER_POLICIES: cannot read"),
        ({"MODELS_CONFIG": "/nonexistent/models.yaml"}, "MODELS_CONFIG: cannot read"),
    ],
)
def test_configuration_errors_exit_2_with_one_line(
    env: dict[str, str], expected: str, tmp_path: Path
) -> None:
    result = run(env, tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("llm-router: configuration error:")
    assert expected in lines[0]
