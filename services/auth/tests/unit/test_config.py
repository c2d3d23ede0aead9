"""Settings from environment dicts; every bad value names its variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from llm_auth.apikeys import generate_key
from llm_auth.config import FailureMode, Settings
from llm_common.config import ConfigError

PEPPER = "x" * 32


def test_defaults() -> None:
    s = Settings.from_env({"AUTH_PEPPER": PEPPER})
    assert s.server.grpc_port == 50051
    assert s.server.metrics_port == 9151
    assert s.redis.prefix == "auth:"
    assert s.key_cache_ttl_s == 30.0
    assert s.rate_limit_failure_mode is FailureMode.OPEN
    assert not s.jwt.enabled
    assert s.bootstrap_admin_key is None
    assert "/grpc.health.v1.Health/Check" in s.public_paths


def test_pepper_from_a_file(tmp_path: Path) -> None:
    secret = tmp_path / "pepper"
    secret.write_text(PEPPER + "\n")
    assert Settings.from_env({"AUTH_PEPPER_FILE": str(secret)}).pepper == PEPPER.encode()


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"AUTH_PEPPER": "short"}, "AUTH_PEPPER"),
        ({"AUTH_PEPPER_FILE": "/nonexistent"}, "AUTH_PEPPER"),
        ({"AUTH_RATE_LIMIT_FAILURE_MODE": "maybe"}, "AUTH_RATE_LIMIT_FAILURE_MODE"),
        ({"AUTH_REDIS_PREFIX": "{tenant}"}, "AUTH_REDIS_PREFIX"),
        ({"AUTH_BOOTSTRAP_ADMIN_KEY": "sk-nope"}, "AUTH_BOOTSTRAP_ADMIN_KEY"),
        ({"AUTH_KEY_CACHE_TTL_S": "-1"}, "AUTH_KEY_CACHE_TTL_S"),
        ({"AUTH_JWT_ALGORITHMS": "none"}, "AUTH_JWT_ALGORITHMS"),
        ({"AUTH_JWT_HS256_SECRET": "s" * 32}, "AUTH_JWT_ALGORITHMS"),
        ({"AUTH_JWT_ALGORITHMS": "HS256"}, "AUTH_JWT_HS256_SECRET"),
        ({"AUTH_JWKS_URL": "https://issuer/jwks"}, "AUTH_JWT_ISSUER"),
        (
            {"AUTH_JWKS_URL": "ftp://x", "AUTH_JWT_ISSUER": "i", "AUTH_JWT_AUDIENCE": "a"},
            "AUTH_JWKS_URL",
        ),
        ({"AUTH_ADMIN_TENANT": "bad tenant"}, "AUTH_ADMIN_TENANT"),
        ({"AUTH_JWT_REQUESTS_PER_MINUTE": "-5"}, "AUTH_JWT_REQUESTS_PER_MINUTE"),
        ({"AUTH_EDGE_PORT": "70000"}, "AUTH_EDGE_PORT"),
        ({"AUTH_EDGE_PORT": "50051"}, "AUTH_EDGE_PORT"),
    ],
)
def test_bad_values_name_their_variable(environ: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"AUTH_PEPPER": PEPPER, **environ})
    assert str(caught.value).startswith(variable)


def test_pepper_is_required() -> None:
    with pytest.raises(ConfigError, match=r"^AUTH_PEPPER: is required"):
        Settings.from_env({})
    with pytest.raises(ConfigError, match=r"^AUTH_PEPPER_FILE: cannot read"):
        Settings.from_env({"AUTH_PEPPER_FILE": "/nonexistent/pepper"})


def test_jwt_and_bootstrap_settings() -> None:
    key = generate_key().text
    s = Settings.from_env(
        {
            "AUTH_PEPPER": PEPPER,
            "AUTH_BOOTSTRAP_ADMIN_KEY": key,
            "AUTH_JWT_ALGORITHMS": "HS256,RS256",
            "AUTH_JWT_HS256_SECRET": "s" * 32,
            "AUTH_JWKS_URL": "https://issuer.example/jwks.json",
            "AUTH_JWT_ISSUER": "https://issuer.example",
            "AUTH_JWT_AUDIENCE": "llm-api",
            "AUTH_RATE_LIMIT_FAILURE_MODE": "CLOSED",
        }
    )
    assert s.bootstrap_admin_key == key
    assert s.jwt.enabled
    assert s.jwt.algorithms == ("HS256", "RS256")
    assert s.rate_limit_failure_mode is FailureMode.CLOSED


def test_edge_port_is_off_unless_set() -> None:
    assert Settings.from_env({"AUTH_PEPPER": PEPPER}).edge_port is None
    assert Settings.from_env({"AUTH_PEPPER": PEPPER, "AUTH_EDGE_PORT": "50061"}).edge_port == 50061
    assert Settings.from_env({"AUTH_PEPPER": PEPPER, "AUTH_EDGE_PORT": "off"}).edge_port is None
