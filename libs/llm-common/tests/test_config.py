"""Environment parsing and ServerSettings validation."""

from __future__ import annotations

import pytest

from llm_common.config import (
    MIB,
    ConfigError,
    ServerSettings,
    env_bool,
    env_float,
    env_int,
    env_list,
    env_str,
)


def _from_env(env: dict[str, str]) -> ServerSettings:
    return ServerSettings.from_env(
        env, service_name="router", default_grpc_port=50053, default_metrics_port=9153
    )


def test_defaults() -> None:
    settings = _from_env({})
    assert settings == ServerSettings("router", 50053, 9153)
    assert settings.shutdown_grace_s == 10.0
    assert settings.log_level == "INFO"
    assert settings.otlp_endpoint is None
    assert settings.max_message_bytes == 16 * MIB


def test_overrides() -> None:
    settings = _from_env(
        {
            "GRPC_PORT": "0",
            "METRICS_PORT": "9999",
            "SHUTDOWN_GRACE_S": "2.5",
            "LOG_LEVEL": "debug",
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://otel:4317",
        }
    )
    assert (settings.grpc_port, settings.metrics_port) == (0, 9999)
    assert settings.shutdown_grace_s == 2.5
    assert settings.log_level == "DEBUG"
    assert settings.otlp_endpoint == "http://otel:4317"


@pytest.mark.parametrize("value", ["off", "OFF", "disabled", "none"])
def test_metrics_port_off_disables_the_endpoint(value: str) -> None:
    assert _from_env({"METRICS_PORT": value}).metrics_port is None


def test_blank_values_count_as_unset() -> None:
    assert _from_env({"GRPC_PORT": "  ", "LOG_LEVEL": ""}).grpc_port == 50053


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"GRPC_PORT": "abc"}, "GRPC_PORT"),
        ({"GRPC_PORT": "70000"}, "GRPC_PORT"),
        ({"GRPC_PORT": "-1"}, "GRPC_PORT"),
        ({"METRICS_PORT": "65536"}, "METRICS_PORT"),
        ({"METRICS_PORT": "nine"}, "METRICS_PORT"),
        ({"SHUTDOWN_GRACE_S": "soon"}, "SHUTDOWN_GRACE_S"),
        ({"SHUTDOWN_GRACE_S": "-1"}, "SHUTDOWN_GRACE_S"),
        ({"SHUTDOWN_GRACE_S": "nan"}, "SHUTDOWN_GRACE_S"),
        ({"LOG_LEVEL": "chatty"}, "LOG_LEVEL"),
        ({"MAX_MESSAGE_BYTES": "0"}, "MAX_MESSAGE_BYTES"),
        ({"BIND_HOST": "1.2.3.4:80"}, "BIND_HOST"),
        ({"BIND_HOST": "a host"}, "BIND_HOST"),
        ({"BIND_HOST": "http://x"}, "BIND_HOST"),
        ({"BIND_HOST": "999.1.1.1"}, "BIND_HOST"),
    ],
)
def test_invalid_values_name_the_variable(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{variable}: ") as info:
        _from_env(env)
    assert info.value.variable == variable
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(
    ("raw", "address", "target"),
    [
        (None, None, "[::]:7"),
        ("0.0.0.0", None, "0.0.0.0:7"),
        ("127.0.0.1", "127.0.0.1", "127.0.0.1:7"),
        ("::1", "::1", "[::1]:7"),
        ("[::1]", "::1", "[::1]:7"),
        ("localhost", "localhost", "localhost:7"),
    ],
)
def test_bind_host(raw: str | None, address: str | None, target: str) -> None:
    settings = _from_env({} if raw is None else {"BIND_HOST": raw})
    assert settings.bind_address == address  # None: every interface
    assert settings.bind_target(7) == target


def test_direct_construction_is_validated() -> None:
    with pytest.raises(ConfigError, match="GRPC_PORT"):
        ServerSettings("x", grpc_port=99999, metrics_port=None)
    with pytest.raises(ConfigError, match="service_name"):
        ServerSettings("", grpc_port=1, metrics_port=None)


def test_settings_are_frozen() -> None:
    settings = _from_env({})
    with pytest.raises(AttributeError):
        settings.grpc_port = 1  # type: ignore[misc]


def test_env_str() -> None:
    env = {"A": " x ", "EMPTY": ""}
    assert env_str(env, "A") == "x"
    assert env_str(env, "MISSING") is None
    assert env_str(env, "EMPTY", "d") == "d"
    with pytest.raises(ConfigError, match=r"^MISSING: is required"):
        env_str(env, "MISSING", required=True)


def test_env_int_bounds() -> None:
    assert env_int({"N": "7"}, "N", 1, min_value=0, max_value=10) == 7
    assert env_int({}, "N", 3) == 3
    with pytest.raises(ConfigError, match=r"^N: must be <= 10"):
        env_int({"N": "11"}, "N", 1, max_value=10)
    with pytest.raises(ConfigError, match=r"^N: expected an integer"):
        env_int({"N": "1.5"}, "N", 1)


def test_env_float() -> None:
    assert env_float({"F": "0.25"}, "F", 1.0) == 0.25
    for bad in ("inf", "-inf", "nan", "x"):
        with pytest.raises(ConfigError, match=r"^F: "):
            env_float({"F": bad}, "F", 1.0)
    with pytest.raises(ConfigError, match=r"^F: must be >= 0"):
        env_float({"F": "-0.5"}, "F", 1.0, min_value=0)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1", True), ("true", True), ("YES", True), ("0", False), ("False", False), ("no", False)],
)
def test_env_bool(raw: str, expected: bool) -> None:
    assert env_bool({"B": raw}, "B", not expected) is expected


def test_env_bool_rejects_other_words() -> None:
    assert env_bool({}, "B", True) is True
    with pytest.raises(ConfigError, match=r"^B: expected a boolean"):
        env_bool({"B": "maybe"}, "B", False)


def test_env_list() -> None:
    assert env_list({"L": "a, b,,c ,"}, "L") == ("a", "b", "c")
    assert env_list({}, "L", ["x"]) == ("x",)
    assert env_list({"L": " "}, "L") == ()


def test_positive_int_tables() -> None:
    from dataclasses import dataclass

    from llm_common.config import positive_ints_from_env, require_positive

    @dataclass(frozen=True)
    class Limits:
        batch: int = 8
        depth: int = 2

    table = {"batch": "X_BATCH", "depth": "X_DEPTH"}
    assert positive_ints_from_env({"X_BATCH": "64"}, table, Limits()) == {"batch": 64, "depth": 2}
    with pytest.raises(ConfigError, match=r"^X_DEPTH"):
        positive_ints_from_env({"X_DEPTH": "0"}, table, Limits())
    require_positive(Limits(), table)
    with pytest.raises(ConfigError, match=r"^X_BATCH: must be >= 1"):
        require_positive(Limits(batch=0), table)
