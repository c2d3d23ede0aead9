"""Settings.from_env: required REDIS_URL, defaults, and errors that name the variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_billing.config import Settings
from llm_billing.workers import check_workers, worker_settings
from llm_common.config import ConfigError

BASE = {"REDIS_URL": "redis://127.0.0.1:6379/0"}


def test_defaults() -> None:
    s = Settings.from_env(BASE)
    assert s.server.grpc_port == 50056
    assert s.server.metrics_port == 9156
    assert s.prices_config == Path("infra/config/prices.yaml")
    assert s.ledger.key_prefix == "billing:"
    assert s.ledger.default_currency == "USD"
    assert s.ledger.reservation_ttl_ms == 600_000
    assert s.ledger.retention_ms == 35 * 86_400_000
    assert s.limits.max_tokens == 100_000_000
    assert s.redis.max_connections == 64
    assert s.workers == 1


def test_overrides() -> None:
    s = Settings.from_env(
        {
            **BASE,
            "PRICES_CONFIG": "/etc/prices.yaml",
            "BILLING_KEY_PREFIX": "t1:billing:",
            "BILLING_DEFAULT_CURRENCY": "eur",
            "BILLING_RESERVATION_TTL_S": "30",
            "BILLING_RECORD_RETENTION_DAYS": "90",
            "BILLING_SWEEP_INTERVAL_S": "0.5",
            "BILLING_MAX_TOKENS": "1000",
            "BILLING_WORKERS": "4",
        }
    )
    assert s.prices_config == Path("/etc/prices.yaml")
    assert s.ledger.key_prefix == "t1:billing:"
    assert s.ledger.default_currency == "EUR"
    assert s.ledger.reservation_ttl_ms == 30_000
    assert s.ledger.record_retention_days == 90
    assert s.ledger.sweep_interval_s == 0.5
    assert s.limits.max_tokens == 1000
    assert s.workers == 4


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({}, "REDIS_URL"),
        ({"REDIS_URL": "http://x"}, "REDIS_URL"),
        ({**BASE, "BILLING_RESERVATION_TTL_S": "0"}, "BILLING_RESERVATION_TTL_S"),
        ({**BASE, "BILLING_RESERVATION_TTL_S": "soon"}, "BILLING_RESERVATION_TTL_S"),
        ({**BASE, "BILLING_DEFAULT_CURRENCY": "dollars"}, "BILLING_DEFAULT_CURRENCY"),
        ({**BASE, "BILLING_KEY_PREFIX": "a{b}"}, "BILLING_KEY_PREFIX"),
        ({**BASE, "BILLING_MAX_TOKENS": "1000000000"}, "BILLING_MAX_TOKENS"),
        ({**BASE, "BILLING_RECORD_RETENTION_DAYS": "0"}, "BILLING_RECORD_RETENTION_DAYS"),
        ({**BASE, "BILLING_WORKERS": "0"}, "BILLING_WORKERS"),
        ({**BASE, "BILLING_WORKERS": "65"}, "BILLING_WORKERS"),
        ({**BASE, "BILLING_WORKERS": "two"}, "BILLING_WORKERS"),
        ({**BASE, "GRPC_PORT": "70000"}, "GRPC_PORT"),
    ],
)
def test_bad_settings_name_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env)
    assert str(info.value).startswith(variable)


def test_reservation_ttl_must_be_shorter_than_retention() -> None:
    env = {
        **BASE,
        "BILLING_RESERVATION_TTL_S": str(2 * 86400),
        "BILLING_RECORD_RETENTION_DAYS": "1",
    }
    with pytest.raises(ConfigError, match="BILLING_RESERVATION_TTL_S"):
        Settings.from_env(env)


def test_workers_share_the_grpc_port_and_get_their_own_metrics_ports() -> None:
    s = Settings.from_env({**BASE, "BILLING_WORKERS": "3", "METRICS_PORT": "9300"})
    ports = [worker_settings(s, i).server for i in range(3)]
    assert [p.grpc_port for p in ports] == [50056] * 3
    assert [p.metrics_port for p in ports] == [9300, 9301, 9302]
    off = Settings.from_env({**BASE, "BILLING_WORKERS": "3", "METRICS_PORT": "off"})
    assert worker_settings(off, 2).server.metrics_port is None


def test_several_workers_need_a_fixed_port() -> None:
    s = Settings.from_env({**BASE, "BILLING_WORKERS": "2", "GRPC_PORT": "0"})
    with pytest.raises(ConfigError) as err:
        check_workers(s)
    assert err.value.variable == "BILLING_WORKERS"
    check_workers(Settings.from_env({**BASE, "GRPC_PORT": "0"}))  # one worker: fine
