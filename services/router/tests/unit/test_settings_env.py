"""The router's settings of attestation, quota leases and the near cache, from the environment."""

from __future__ import annotations

import pytest

from llm_common.config import ConfigError
from llm_router.admission.quota_lease import LeaseSettings
from llm_router.cache.near import NearCacheSettings
from llm_router.config import Settings
from llm_router.tokens.attestation import AttestationSettings

BASE_ENV = {
    "TOKENIZER_SERVICE_ADDR": "t:1",
    "BILLING_SERVICE_ADDR": "b:1",
    "AUTH_SERVICE_ADDR": "a:1",
    "CACHE_SERVICE_ADDR": "off",
}


def test_settings_from_env() -> None:
    base = BASE_ENV
    settings = Settings.from_env(base)
    assert settings.attestation == AttestationSettings(interval_s=2.0, audit_rate=0.01)
    settings = Settings.from_env(
        base | {"ROUTER_TOKENIZER_ATTEST_INTERVAL_S": "0", "ROUTER_TOKENIZER_AUDIT_RATE": "1"}
    )
    assert settings.attestation == AttestationSettings(interval_s=0.0, audit_rate=1.0)
    for name, value in (
        ("ROUTER_TOKENIZER_ATTEST_INTERVAL_S", "-1"),
        ("ROUTER_TOKENIZER_AUDIT_RATE", "1.5"),
    ):
        with pytest.raises(ConfigError, match=name):
            Settings.from_env(base | {name: value})


def test_lease_settings_from_env() -> None:
    assert Settings.from_env(BASE_ENV).leases == LeaseSettings(lease_s=2.0, max_share=0.05)
    settings = Settings.from_env(
        BASE_ENV | {"ROUTER_QUOTA_LEASE_S": "0", "ROUTER_QUOTA_LEASE_MAX_SHARE": "0.2"}
    )
    assert settings.leases == LeaseSettings(lease_s=0.0, max_share=0.2)
    for name, value in (("ROUTER_QUOTA_LEASE_S", "-1"), ("ROUTER_QUOTA_LEASE_MAX_SHARE", "0.9")):
        with pytest.raises(ConfigError, match=name):
            Settings.from_env(BASE_ENV | {name: value})


def test_near_cache_settings_from_env() -> None:
    default = Settings.from_env(BASE_ENV).near_cache
    assert default == NearCacheSettings()
    assert default.enabled
    settings = Settings.from_env(
        BASE_ENV
        | {
            "ROUTER_NEAR_CACHE_ENTRIES": "0",
            "ROUTER_NEAR_CACHE_MAX_BYTES": "1024",
            "ROUTER_NEAR_CACHE_TTL_S": "2.5",
            "ROUTER_NEAR_CACHE_REPORT_S": "0.5",
        }
    )
    assert settings.near_cache == NearCacheSettings(0, 1024, 2.5, 0.5)
    assert not settings.near_cache.enabled
    for name, value in (
        ("ROUTER_NEAR_CACHE_ENTRIES", "-1"),
        ("ROUTER_NEAR_CACHE_TTL_S", "0"),
        ("ROUTER_NEAR_CACHE_REPORT_S", "120"),
    ):
        with pytest.raises(ConfigError, match=name):
            Settings.from_env(BASE_ENV | {name: value})
