"""Fixtures for llm-common's own tests."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

# The monorepo's root conftest registers this plugin; importing its fixtures here lets the
# package's tests also run on their own (only the root conftest may set pytest_plugins).
from llm_common.metrics import RpcMetrics
from llm_testing.pytest_plugin import (
    json_logs,
    private_redis,
    redis_client,
    redis_prefix,
    redis_url,
)

__all__ = ["json_logs", "private_redis", "redis_client", "redis_prefix", "redis_url"]


@pytest.fixture
def registry() -> CollectorRegistry:
    """A fresh Prometheus registry, so metric assertions see only this test's samples."""
    return CollectorRegistry()


@pytest.fixture
def rpc_metrics(registry: CollectorRegistry) -> RpcMetrics:
    return RpcMetrics(registry)
