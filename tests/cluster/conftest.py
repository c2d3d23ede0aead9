"""Redis Cluster scenarios (`make test-cluster`, `pytest -m cluster`): key spread over the
masters and failover under load, each on a local 3 masters + 3 replicas cluster. Skipped in
every other run, so `make ci` does not start clusters."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cluster: Redis Cluster scenarios (make test-cluster)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "cluster" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="Redis Cluster scenarios run only with -m cluster")
    for item in items:
        if item.get_closest_marker("cluster") is not None:
            item.add_marker(skip)
