"""Auth service settings, read from the environment once in __main__ (tests pass dicts)."""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from llm_auth.apikeys import MalformedKeyError, parse_key
from llm_auth.failure_throttle import ThrottleSettings
from llm_common.config import (
    ConfigError,
    ServerSettings,
    env_float,
    env_int,
    env_list,
    env_optional_port,
    env_str,
)
from llm_common.redis_conn import is_cluster_url, redis_url_from_env

SERVICE_NAME = "auth"
DEFAULT_GRPC_PORT = 50051
DEFAULT_METRICS_PORT = 9151
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
MIN_PEPPER_BYTES = 32
MIN_HS256_SECRET_BYTES = 32
# Only asymmetric algorithms by default; HS256 must be named explicitly with its secret.
DEFAULT_JWT_ALGORITHMS = ("RS256", "ES256")
SUPPORTED_JWT_ALGORITHMS = frozenset({"HS256", "RS256", "ES256"})
DEFAULT_PUBLIC_PATHS = (
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/healthz",
)
# Braces would change the Redis Cluster hash tag of every key built on the prefix.
_PREFIX_PATTERN = re.compile(r"[A-Za-z0-9:._-]{0,64}")
_TENANT_PATTERN = re.compile(r"[A-Za-z0-9._-]{1,64}")


class FailureMode(enum.Enum):
    """What a rate-limit check answers when Redis cannot be reached."""

    OPEN = "open"  # allow, and count it
    CLOSED = "closed"  # deny, and count it


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """Where state lives and how long to wait for it."""

    url: str = DEFAULT_REDIS_URL
    prefix: str = "auth:"
    timeout_s: float = 0.25  # per command; a hung Redis must not stall authentication
    breaker_fail_max: int = 3
    breaker_reset_s: float = 5.0
    max_connections: int = 128
    # Key writes (create, rotate, revoke) are acknowledged once this many replicas have them
    # (WAIT), so a failover cannot undo a revocation; 0: no wait.
    wait_replicas: int = 0
    wait_timeout_ms: int = 250

    def __post_init__(self) -> None:
        if not _PREFIX_PATTERN.fullmatch(self.prefix):
            raise ConfigError.for_variable(
                "AUTH_REDIS_PREFIX", "must be at most 64 characters of A-Z a-z 0-9 : . _ -"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        url = redis_url_from_env(environ, DEFAULT_REDIS_URL)
        return cls(
            url=url,
            prefix=environ.get("AUTH_REDIS_PREFIX", "auth:").strip(),
            timeout_s=env_float(environ, "AUTH_REDIS_TIMEOUT_S", 0.25, min_value=0.01),
            breaker_fail_max=env_int(environ, "AUTH_REDIS_BREAKER_FAIL_MAX", 3, min_value=1),
            breaker_reset_s=env_float(environ, "AUTH_REDIS_BREAKER_RESET_S", 5.0, min_value=0.1),
            max_connections=env_int(environ, "AUTH_REDIS_MAX_CONNECTIONS", 128, min_value=2),
            wait_replicas=env_int(
                environ, "AUTH_REDIS_WAIT_REPLICAS", int(is_cluster_url(url)), max_value=8
            ),
            wait_timeout_ms=env_int(
                environ, "AUTH_REDIS_WAIT_TIMEOUT_MS", 250, min_value=1, max_value=60_000
            ),
        )


@dataclass(frozen=True, slots=True)
class DefaultLimits:
    """Limits for principals without a stored key (JWT subjects) and for whole tenants.

    0 means unlimited.
    """

    jwt_requests_per_minute: int = 0
    jwt_tokens_per_minute: int = 0
    jwt_max_concurrent: int = 0
    tenant_requests_per_minute: int = 0
    tenant_tokens_per_minute: int = 0

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        values = {
            name: env_int(environ, variable, 0, min_value=0, max_value=10**12)
            for name, variable in _LIMIT_VARIABLES.items()
        }
        return cls(**values)


_LIMIT_VARIABLES = {
    "jwt_requests_per_minute": "AUTH_JWT_REQUESTS_PER_MINUTE",
    "jwt_tokens_per_minute": "AUTH_JWT_TOKENS_PER_MINUTE",
    "jwt_max_concurrent": "AUTH_JWT_MAX_CONCURRENT",
    "tenant_requests_per_minute": "AUTH_TENANT_REQUESTS_PER_MINUTE",
    "tenant_tokens_per_minute": "AUTH_TENANT_TOKENS_PER_MINUTE",
}


@dataclass(frozen=True, slots=True)
class JwtSettings:
    """JWT verification; enabled when an HS256 secret, a JWKS file or a JWKS URL is set."""

    algorithms: tuple[str, ...] = DEFAULT_JWT_ALGORITHMS
    hs256_secret: bytes | None = None
    jwks_file: Path | None = None
    jwks_url: str | None = None
    issuer: str | None = None
    audience: str | None = None
    leeway_s: float = 30.0
    tenant_claim: str = "tenant_id"
    scopes_claim: str = "scope"
    models_claim: str = "models"
    jwks_cache_ttl_s: float = 300.0
    jwks_min_refresh_s: float = 10.0  # unknown kids refetch the JWKS at most this often
    jwks_timeout_s: float = 2.0
    verified_cache_ttl_s: float = 30.0  # a verified token is trusted this long (0 = never)

    @property
    def enabled(self) -> bool:
        return bool(self.hs256_secret or self.jwks_file or self.jwks_url)

    def __post_init__(self) -> None:
        unknown = set(self.algorithms) - SUPPORTED_JWT_ALGORITHMS
        if unknown or not self.algorithms:
            raise ConfigError.for_variable(
                "AUTH_JWT_ALGORITHMS",
                f"must list some of {', '.join(sorted(SUPPORTED_JWT_ALGORITHMS))}",
            )
        self._check_sources()
        if self.enabled and not (self.issuer and self.audience):
            # Without both checks a token minted for another service would be accepted.
            raise ConfigError.for_variable(
                "AUTH_JWT_ISSUER", "AUTH_JWT_ISSUER and AUTH_JWT_AUDIENCE are required for JWT"
            )
        if self.jwks_url is not None and not self.jwks_url.startswith(("https://", "http://")):
            raise ConfigError.for_variable("AUTH_JWKS_URL", "must be an http(s) URL")

    def _check_sources(self) -> None:
        if self.hs256_secret is not None:
            if len(self.hs256_secret) < MIN_HS256_SECRET_BYTES:
                raise ConfigError.for_variable(
                    "AUTH_JWT_HS256_SECRET", f"must be at least {MIN_HS256_SECRET_BYTES} bytes"
                )
            if "HS256" not in self.algorithms:
                raise ConfigError.for_variable(
                    "AUTH_JWT_ALGORITHMS", "must include HS256 when AUTH_JWT_HS256_SECRET is set"
                )
        elif "HS256" in self.algorithms:
            raise ConfigError.for_variable(
                "AUTH_JWT_HS256_SECRET", "is required when AUTH_JWT_ALGORITHMS includes HS256"
            )
        if self.jwks_file is not None and self.jwks_url is not None:
            raise ConfigError.for_variable("AUTH_JWKS_URL", "set AUTH_JWKS_FILE or AUTH_JWKS_URL")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        secret = _secret(environ, "AUTH_JWT_HS256_SECRET")
        jwks_file = env_str(environ, "AUTH_JWKS_FILE")
        return cls(
            algorithms=env_list(environ, "AUTH_JWT_ALGORITHMS", DEFAULT_JWT_ALGORITHMS),
            hs256_secret=secret,
            jwks_file=Path(jwks_file) if jwks_file else None,
            jwks_url=env_str(environ, "AUTH_JWKS_URL"),
            issuer=env_str(environ, "AUTH_JWT_ISSUER"),
            audience=env_str(environ, "AUTH_JWT_AUDIENCE"),
            leeway_s=env_float(environ, "AUTH_JWT_LEEWAY_S", 30.0, min_value=0, max_value=600),
            tenant_claim=env_str(environ, "AUTH_JWT_TENANT_CLAIM", "tenant_id"),
            scopes_claim=env_str(environ, "AUTH_JWT_SCOPES_CLAIM", "scope"),
            models_claim=env_str(environ, "AUTH_JWT_MODELS_CLAIM", "models"),
            jwks_cache_ttl_s=env_float(environ, "AUTH_JWKS_CACHE_TTL_S", 300.0, min_value=1),
            jwks_min_refresh_s=env_float(environ, "AUTH_JWKS_MIN_REFRESH_S", 10.0, min_value=0),
            jwks_timeout_s=env_float(environ, "AUTH_JWKS_TIMEOUT_S", 2.0, min_value=0.1),
            verified_cache_ttl_s=env_float(
                environ, "AUTH_JWT_CACHE_TTL_S", 30.0, min_value=0, max_value=3600
            ),
        )


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the auth service needs to run."""

    server: ServerSettings
    pepper: bytes
    redis: RedisSettings = field(default_factory=RedisSettings)
    jwt: JwtSettings = field(default_factory=JwtSettings)
    limits: DefaultLimits = field(default_factory=DefaultLimits)
    key_cache_ttl_s: float = 30.0  # how long a verified key survives a Redis outage
    key_fresh_s: float = 2.0  # a verified key is re-read from Redis after this (0 = always)
    key_cache_max_entries: int = 100_000
    rate_limit_failure_mode: FailureMode = FailureMode.OPEN
    bootstrap_admin_key: str | None = None
    admin_tenant: str = "system"
    public_paths: tuple[str, ...] = DEFAULT_PUBLIC_PATHS
    reservation_ttl_s: float = 3600.0
    default_lease_ttl_s: float = 600.0
    max_lease_ttl_s: float = 3600.0
    # A second listener with only ext_authz Check and ShouldRateLimit, without interceptors
    # (see llm_auth.edge); None = off, 0 = a free port.
    edge_port: int | None = None
    # Envoy's ext_authz over HTTP/1.1 (see llm_auth.http_authz); None = off, 0 = a free port.
    http_authz_port: int | None = None
    failed_auth: ThrottleSettings = field(default_factory=ThrottleSettings)

    def __post_init__(self) -> None:
        if len(self.pepper) < MIN_PEPPER_BYTES:
            raise ConfigError.for_variable(
                "AUTH_PEPPER", f"must be at least {MIN_PEPPER_BYTES} bytes"
            )
        if not _TENANT_PATTERN.fullmatch(self.admin_tenant):
            raise ConfigError.for_variable("AUTH_ADMIN_TENANT", "must match [A-Za-z0-9._-]{1,64}")
        if self.bootstrap_admin_key is not None:
            try:
                parse_key(self.bootstrap_admin_key)
            except MalformedKeyError:
                raise ConfigError.for_variable(
                    "AUTH_BOOTSTRAP_ADMIN_KEY", "must be a key as printed by `keys create`"
                ) from None
        if self.edge_port and self.edge_port == self.server.grpc_port:
            raise ConfigError.for_variable("AUTH_EDGE_PORT", "must differ from GRPC_PORT")
        if self.http_authz_port and self.http_authz_port in (
            self.server.grpc_port,
            self.edge_port,
        ):
            raise ConfigError.for_variable(
                "AUTH_HTTP_AUTHZ_PORT", "must differ from GRPC_PORT and AUTH_EDGE_PORT"
            )
        if self.default_lease_ttl_s > self.max_lease_ttl_s:
            raise ConfigError.for_variable(
                "AUTH_DEFAULT_LEASE_TTL_S", "must not exceed AUTH_MAX_LEASE_TTL_S"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        """Read GRPC_PORT, METRICS_PORT, ... (see ServerSettings), REDIS_URL and AUTH_*;
        ConfigError names the offending variable."""
        server = ServerSettings.from_env(
            environ,
            service_name=SERVICE_NAME,
            default_grpc_port=DEFAULT_GRPC_PORT,
            default_metrics_port=DEFAULT_METRICS_PORT,
        )
        return cls(
            server=server,
            pepper=_required_secret(environ, "AUTH_PEPPER"),
            redis=RedisSettings.from_env(environ),
            jwt=JwtSettings.from_env(environ),
            limits=DefaultLimits.from_env(environ),
            key_cache_ttl_s=env_float(environ, "AUTH_KEY_CACHE_TTL_S", 30.0, min_value=0),
            key_fresh_s=env_float(environ, "AUTH_KEY_FRESH_S", 2.0, min_value=0, max_value=60),
            key_cache_max_entries=env_int(
                environ, "AUTH_KEY_CACHE_MAX_ENTRIES", 100_000, min_value=1
            ),
            rate_limit_failure_mode=_failure_mode(environ),
            bootstrap_admin_key=_secret_text(environ, "AUTH_BOOTSTRAP_ADMIN_KEY"),
            admin_tenant=env_str(environ, "AUTH_ADMIN_TENANT", "system"),
            public_paths=env_list(environ, "AUTH_PUBLIC_PATHS", DEFAULT_PUBLIC_PATHS),
            reservation_ttl_s=env_float(environ, "AUTH_RESERVATION_TTL_S", 3600.0, min_value=60),
            default_lease_ttl_s=env_float(environ, "AUTH_DEFAULT_LEASE_TTL_S", 600.0, min_value=1),
            max_lease_ttl_s=env_float(environ, "AUTH_MAX_LEASE_TTL_S", 3600.0, min_value=1),
            edge_port=env_optional_port(environ, "AUTH_EDGE_PORT", None),
            http_authz_port=env_optional_port(environ, "AUTH_HTTP_AUTHZ_PORT", None),
            failed_auth=_failed_auth(environ),
        )


def _failed_auth(environ: Mapping[str, str]) -> ThrottleSettings:
    return ThrottleSettings(
        limit=env_int(environ, "AUTH_FAILED_AUTH_LIMIT", 20, min_value=0),
        window_s=env_float(environ, "AUTH_FAILED_AUTH_WINDOW_S", 60.0, min_value=1),
        max_tracked=env_int(environ, "AUTH_FAILED_AUTH_MAX_TRACKED", 100_000, min_value=1),
    )


def _failure_mode(environ: Mapping[str, str]) -> FailureMode:
    raw = env_str(environ, "AUTH_RATE_LIMIT_FAILURE_MODE", "open").lower()
    try:
        return FailureMode(raw)
    except ValueError:
        raise ConfigError.for_variable(
            "AUTH_RATE_LIMIT_FAILURE_MODE", f"must be open or closed, got {raw!r}"
        ) from None


def _secret_text(environ: Mapping[str, str], name: str) -> str | None:
    """`name`, or the content of the file named by `<name>_FILE` (a mounted secret)."""
    value = env_str(environ, name)
    path = env_str(environ, f"{name}_FILE")
    if value is not None and path is not None:
        raise ConfigError.for_variable(name, f"set {name} or {name}_FILE, not both")
    if path is None:
        return value
    try:
        return Path(path).read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ConfigError.for_variable(f"{name}_FILE", f"cannot read: {exc.strerror}") from None


def _secret(environ: Mapping[str, str], name: str) -> bytes | None:
    text = _secret_text(environ, name)
    return None if text is None else text.encode("utf-8")


def _required_secret(environ: Mapping[str, str], name: str) -> bytes:
    value = _secret(environ, name)
    if value is None:
        raise ConfigError.for_variable(name, f"is required (or {name}_FILE)")
    return value
