"""Typed environment readers and the server settings every service embeds."""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Self, overload

if TYPE_CHECKING:
    from llm_common.server_tls import ServerTls

MIB = 1 << 20
ANY_HOST = "[::]"  # every interface, IPv4 and IPv6
WILDCARD_HOSTS = frozenset({ANY_HOST, "::", "0.0.0.0"})
_HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})
_DISABLED = frozenset({"off", "none", "disabled"})


class ConfigError(ValueError):
    """Invalid or missing configuration; the message starts with the variable's name."""

    def __init__(self, message: str, *, variable: str | None = None) -> None:
        super().__init__(message)
        self.variable = variable

    @classmethod
    def for_variable(cls, name: str, problem: str) -> ConfigError:
        """An error for environment variable `name`."""
        return cls(f"{name}: {problem}", variable=name)


def _raw(environ: Mapping[str, str], name: str) -> str | None:
    # A variable set to an empty string counts as unset, as shells and compose files produce those.
    value = environ.get(name)
    if value is None or not value.strip():
        return None
    return value.strip()


@overload
def env_str(
    environ: Mapping[str, str], name: str, default: str, *, required: bool = ...
) -> str: ...
@overload
def env_str(
    environ: Mapping[str, str], name: str, default: None = ..., *, required: Literal[True]
) -> str: ...
@overload
def env_str(
    environ: Mapping[str, str], name: str, default: None = ..., *, required: bool = ...
) -> str | None: ...
def env_str(
    environ: Mapping[str, str], name: str, default: str | None = None, *, required: bool = False
) -> str | None:
    """The stripped value of `name`, else `default`; ConfigError when required and unset."""
    value = _raw(environ, name)
    if value is not None:
        return value
    if required and default is None:
        raise ConfigError.for_variable(name, "is required but not set")
    return default


def _check_range(name: str, value: float, min_value: float | None, max_value: float | None) -> None:
    if min_value is not None and value < min_value:
        raise ConfigError.for_variable(name, f"must be >= {min_value}, got {value}")
    if max_value is not None and value > max_value:
        raise ConfigError.for_variable(name, f"must be <= {max_value}, got {value}")


def env_int(
    environ: Mapping[str, str],
    name: str,
    default: int,
    *,
    min_value: int | None = None,
    max_value: int | None = None,
) -> int:
    """An integer variable, bounds inclusive; the default is checked too."""
    raw = _raw(environ, name)
    try:
        value = default if raw is None else int(raw, 10)
    except ValueError:
        raise ConfigError.for_variable(name, f"expected an integer, got {raw!r}") from None
    _check_range(name, value, min_value, max_value)
    return value


def env_float(
    environ: Mapping[str, str],
    name: str,
    default: float,
    *,
    min_value: float | None = None,
    max_value: float | None = None,
) -> float:
    """A finite float variable, bounds inclusive."""
    raw = _raw(environ, name)
    try:
        value = default if raw is None else float(raw)
    except ValueError:
        raise ConfigError.for_variable(name, f"expected a number, got {raw!r}") from None
    if not math.isfinite(value):
        raise ConfigError.for_variable(name, f"must be a finite number, got {raw!r}")
    _check_range(name, value, min_value, max_value)
    return value


def env_bool(environ: Mapping[str, str], name: str, default: bool) -> bool:
    """A boolean variable: 1/0, true/false, yes/no, on/off (any case)."""
    raw = _raw(environ, name)
    if raw is None:
        return default
    lowered = raw.lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError.for_variable(name, f"expected a boolean (true/false), got {raw!r}")


def env_list(environ: Mapping[str, str], name: str, default: Sequence[str] = ()) -> tuple[str, ...]:
    """A comma-separated variable; items are stripped and empty items dropped."""
    raw = _raw(environ, name)
    if raw is None:
        return tuple(default)
    return tuple(item.strip() for item in raw.split(",") if item.strip())


def env_port(environ: Mapping[str, str], name: str, default: int) -> int:
    """A TCP port, 0..65535 (0 binds an ephemeral port)."""
    return env_int(environ, name, default, min_value=0, max_value=65535)


def env_optional_port(environ: Mapping[str, str], name: str, default: int | None) -> int | None:
    """Like env_port, but `off`/`none`/`disabled` yield None (the listener is not started)."""
    raw = _raw(environ, name)
    if raw is not None and raw.lower() in _DISABLED:
        return None
    if raw is None and default is None:
        return None
    return env_port(environ, name, 0 if default is None else default)


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """What `llm_common.server` needs to run any service.

    `metrics_port` None disables the Prometheus endpoint (METRICS_PORT=off); 0 binds an
    ephemeral port, which tests use.
    """

    service_name: str
    grpc_port: int
    metrics_port: int | None
    shutdown_grace_s: float = 10.0
    log_level: str = "INFO"
    otlp_endpoint: str | None = None
    max_message_bytes: int = 16 * MIB
    # Where every listener of the service binds: all interfaces by default (containers);
    # a single-host layout binds loopback, so the unauthenticated internal ports (which trust
    # the edge's identity headers) are not reachable from the network.
    bind_host: str = ANY_HOST
    # GRPC_TLS_*: the gRPC port demands a client certificate (llm_common.server_tls).
    tls: ServerTls | None = None

    def __post_init__(self) -> None:
        if not self.service_name:
            raise ConfigError("service_name: must not be empty", variable="service_name")
        _check_port("GRPC_PORT", self.grpc_port)
        if self.metrics_port is not None:
            _check_port("METRICS_PORT", self.metrics_port)
        if not math.isfinite(self.shutdown_grace_s) or self.shutdown_grace_s < 0:
            raise ConfigError.for_variable("SHUTDOWN_GRACE_S", "must be a finite number >= 0")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError.for_variable("LOG_LEVEL", f"must be one of {', '.join(LOG_LEVELS)}")
        if self.max_message_bytes <= 0:
            raise ConfigError.for_variable("MAX_MESSAGE_BYTES", "must be positive")
        if not _is_host(self.bind_host):
            raise ConfigError.for_variable(
                "BIND_HOST", "must be an IP address or host name, e.g. 127.0.0.1 or [::]"
            )

    @classmethod
    def from_env(
        cls,
        environ: Mapping[str, str],
        *,
        service_name: str,
        default_grpc_port: int,
        default_metrics_port: int | None,
    ) -> Self:
        """Read GRPC_PORT, METRICS_PORT, SHUTDOWN_GRACE_S, LOG_LEVEL, MAX_MESSAGE_BYTES,
        OTEL_EXPORTER_OTLP_ENDPOINT, BIND_HOST and GRPC_TLS_*; ConfigError names the offending
        variable."""
        from llm_common.server_tls import ServerTls  # it needs this module's helpers

        return cls(
            service_name=service_name,
            grpc_port=env_port(environ, "GRPC_PORT", default_grpc_port),
            metrics_port=env_optional_port(environ, "METRICS_PORT", default_metrics_port),
            shutdown_grace_s=env_float(environ, "SHUTDOWN_GRACE_S", 10.0, min_value=0.0),
            log_level=env_str(environ, "LOG_LEVEL", "INFO").upper(),
            otlp_endpoint=env_str(environ, "OTEL_EXPORTER_OTLP_ENDPOINT"),
            max_message_bytes=env_int(environ, "MAX_MESSAGE_BYTES", 16 * MIB, min_value=1),
            bind_host=env_str(environ, "BIND_HOST", ANY_HOST),
            tls=ServerTls.from_env(environ),
        )

    @property
    def bind_address(self) -> str | None:
        """`bind_host` for a plain socket (no brackets), or None for every interface."""
        if self.bind_host in WILDCARD_HOSTS:
            return None
        return self.bind_host.removeprefix("[").removesuffix("]")

    def bind_target(self, port: int, host: str | None = None) -> str:
        """`host:port` for grpc's add_insecure_port (an IPv6 address in brackets); `host`
        overrides `bind_host` (tests bind 127.0.0.1)."""
        host = self.bind_host if host is None else host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"{host}:{port}"


def _is_host(host: str) -> bool:
    """An IPv4/IPv6 address (IPv6 optionally in brackets) or a DNS name."""
    try:
        ipaddress.ip_address(host.removeprefix("[").removesuffix("]"))
    except ValueError:
        return _HOST_NAME.fullmatch(host) is not None and not host.replace(".", "").isdigit()
    return True


def _check_port(name: str, port: int) -> None:
    if not 0 <= port <= 65535:
        raise ConfigError.for_variable(name, f"must be a port in 0..65535, got {port}")


def require_positive(values: object, variables: Mapping[str, str]) -> None:
    """Check that each field named in `variables` (field → variable) is >= 1."""
    for name, variable in variables.items():
        if getattr(values, name) < 1:
            raise ConfigError.for_variable(variable, "must be >= 1")


def positive_ints_from_env(
    environ: Mapping[str, str], variables: Mapping[str, str], defaults: object
) -> dict[str, int]:
    """Field → value for a table of field → variable, each >= 1, defaulting to `defaults`."""
    return {
        name: env_int(environ, variable, getattr(defaults, name), min_value=1)
        for name, variable in variables.items()
    }
