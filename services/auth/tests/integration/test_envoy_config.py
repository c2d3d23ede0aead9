"""The Envoy config the integration tests render is one Envoy 1.40 accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_auth.testing import render, validate

pytestmark = pytest.mark.integration

TEMPLATE = Path(__file__).with_name("envoy.yaml.tmpl")


def test_rendered_config_validates(tmp_path: Path) -> None:
    config = tmp_path / "envoy.yaml"
    config.write_text(render(TEMPLATE, listener_port=10000, upstream_port=10001, auth_port=10002))
    result = validate(config)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "OK" in result.stdout
