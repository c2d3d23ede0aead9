"""models.yaml `discovery` per deployment: static (default), dns and kubernetes, and the
start-up errors for a dynamic deployment without a service or port."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_common.config import ConfigError
from llm_common.models_config import Discovery, load_catalog

HEAD = "models:\n  - name: m\n    checkpoint: m\n    deployments:\n"


def catalog(tmp_path: Path, deployments: str) -> Path:
    path = tmp_path / "models.yaml"
    path.write_text(HEAD + deployments, encoding="utf-8")
    return path


def test_discovery_kinds_parse(tmp_path: Path) -> None:
    path = catalog(tmp_path, (
        "      - {name: s, replicas: ['h:1']}\n"
        "      - {name: d, discovery: dns, service: inf.llm.svc, port: 50054, interval_s: 2,"
        " nameserver: '127.0.0.1:5353'}\n"
        "      - {name: k, discovery: kubernetes, service: inference, namespace: llm,"
        " port: 50054, weights_digest: abc}\n"
        "      - {name: f, discovery: file, path: /run/replicas.txt}\n"
    ))  # fmt: skip
    static, dns, kube, listed = load_catalog(path, tmp_path).models["m"].deployments
    assert listed.discovery == Discovery(kind="file", path="/run/replicas.txt")
    assert static.discovery == Discovery()
    assert not static.discovery.dynamic
    assert dns.discovery == Discovery(
        kind="dns", service="inf.llm.svc", port=50054, interval_s=2.0, nameserver="127.0.0.1:5353"
    )
    assert kube.discovery == Discovery(
        kind="kubernetes", service="inference", namespace="llm", port=50054, weights_digest="abc"
    )
    assert kube.discovery.dynamic


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("{name: d, discovery: consul, service: x, port: 1}", "discovery must be one of"),
        ("{name: d, discovery: dns, port: 1}", "dns discovery needs `service` and `port`"),
        ("{name: d, discovery: kubernetes, service: x}", "needs `service` and `port`"),
        ("{name: d, discovery: dns, service: x, port: 1, interval_s: 0}", "interval_s"),
        ("{name: d, discovery: file}", "file discovery needs `path`"),
    ],
)
def test_bad_discovery_fails_start_up(tmp_path: Path, entry: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_catalog(catalog(tmp_path, f"      - {entry}\n"), tmp_path)
