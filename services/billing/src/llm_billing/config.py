"""Billing service settings, read from the environment once in __main__ (tests pass dicts)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from llm_common.config import (
    ConfigError,
    ServerSettings,
    env_bool,
    env_float,
    env_int,
    env_str,
)
from llm_common.redis_conn import URL_PREFIXES, is_cluster_url, redis_url_from_env

SERVICE_NAME = "billing"
DEFAULT_GRPC_PORT = 50056
DEFAULT_METRICS_PORT = 9156
DEFAULT_PRICES_CONFIG = "infra/config/prices.yaml"
DEFAULT_KEY_PREFIX = "billing:"
DAY_S = 86_400
MAX_WORKERS = 64
# Token counts above this would make the ledger's integer arithmetic in Lua (IEEE doubles,
# exact below 2**53) inexact for the largest prices; see ledger.lua.
MAX_TOKENS_CEILING = 100_000_000
_CURRENCY = re.compile(r"[A-Z]{3}")
_PREFIX = re.compile(r"[A-Za-z0-9._:-]{0,64}")


@dataclass(frozen=True, slots=True)
class LedgerSettings:
    """How the ledger keeps reservations and records."""

    key_prefix: str = DEFAULT_KEY_PREFIX  # every Redis key starts with it
    default_currency: str = "USD"  # when prices.yaml names none
    reservation_ttl_s: float = 600.0  # an unsettled reservation is charged after this
    record_retention_days: int = 35  # per-request records (and idempotency) are kept this long
    sweep_interval_s: float = 5.0  # how often expired reservations are charged

    def __post_init__(self) -> None:
        if not _PREFIX.fullmatch(self.key_prefix):
            raise ConfigError.for_variable(
                "BILLING_KEY_PREFIX", "must be at most 64 characters [A-Za-z0-9._:-]"
            )
        if not _CURRENCY.fullmatch(self.default_currency):
            raise ConfigError.for_variable(
                "BILLING_DEFAULT_CURRENCY", "must be an ISO 4217 code such as USD"
            )
        if not 1.0 <= self.reservation_ttl_s <= self.record_retention_days * DAY_S:
            raise ConfigError.for_variable(
                "BILLING_RESERVATION_TTL_S", "must be >= 1 and shorter than the record retention"
            )
        if self.sweep_interval_s <= 0:
            raise ConfigError.for_variable("BILLING_SWEEP_INTERVAL_S", "must be > 0")

    @property
    def reservation_ttl_ms(self) -> int:
        return round(self.reservation_ttl_s * 1000)

    @property
    def retention_ms(self) -> int:
        return self.record_retention_days * DAY_S * 1000

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        return cls(
            key_prefix=env_str(environ, "BILLING_KEY_PREFIX", DEFAULT_KEY_PREFIX),
            default_currency=env_str(environ, "BILLING_DEFAULT_CURRENCY", "USD").upper(),
            reservation_ttl_s=env_float(environ, "BILLING_RESERVATION_TTL_S", 600.0, min_value=1.0),
            record_retention_days=env_int(
                environ, "BILLING_RECORD_RETENTION_DAYS", 35, min_value=1, max_value=3660
            ),
            sweep_interval_s=env_float(
                environ, "BILLING_SWEEP_INTERVAL_S", 5.0, min_value=0.01, max_value=3600.0
            ),
        )


@dataclass(frozen=True, slots=True)
class Limits:
    """Input size limits checked before any Redis work."""

    max_tokens: int = MAX_TOKENS_CEILING  # per token field of Reserve/Settle
    max_range_days: int = 366  # GetUsage / ExportUsage time range

    def __post_init__(self) -> None:
        if not 1 <= self.max_tokens <= MAX_TOKENS_CEILING:
            raise ConfigError.for_variable(
                "BILLING_MAX_TOKENS", f"must be in 1..{MAX_TOKENS_CEILING}"
            )
        if not 1 <= self.max_range_days <= 3660:
            raise ConfigError.for_variable("BILLING_MAX_RANGE_DAYS", "must be in 1..3660")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        return cls(
            max_tokens=env_int(environ, "BILLING_MAX_TOKENS", MAX_TOKENS_CEILING, min_value=1),
            max_range_days=env_int(environ, "BILLING_MAX_RANGE_DAYS", 366, min_value=1),
        )


@dataclass(frozen=True, slots=True)
class RedisSettings:
    """The ledger's Redis connection."""

    url: str
    max_connections: int = 64  # pool size; callers wait for a free connection beyond it
    timeout_s: float = 2.0  # connect and per-command socket timeout
    # Reserve/Settle are acknowledged once this many replicas have them (WAIT); 0: no wait.
    wait_replicas: int = 0
    wait_timeout_ms: int = 250

    def __post_init__(self) -> None:
        if not self.url.startswith(URL_PREFIXES):
            raise ConfigError.for_variable(
                "REDIS_URL", "must be a redis://, rediss:// or unix:// URL"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        return cls(
            url=(url := redis_url_from_env(environ, None)),
            max_connections=env_int(
                environ, "BILLING_REDIS_MAX_CONNECTIONS", 64, min_value=1, max_value=10_000
            ),
            timeout_s=env_float(
                environ, "BILLING_REDIS_TIMEOUT_S", 2.0, min_value=0.01, max_value=60.0
            ),
            wait_replicas=env_int(
                environ, "BILLING_WAIT_REPLICAS", int(is_cluster_url(url)), min_value=0, max_value=8
            ),
            wait_timeout_ms=env_int(
                environ, "BILLING_WAIT_TIMEOUT_MS", 250, min_value=1, max_value=60_000
            ),
        )


_DB_SCHEMES = ("postgresql://", "postgresql+psycopg://", "postgres://", "sqlite:///")


@dataclass(frozen=True, slots=True)
class UsageStoreSettings:
    """The durable SQL usage store fed by the Redis outbox (off when `database_url` is None)."""

    database_url: str | None = None  # postgresql://... or sqlite:///path (secret: never logged)
    batch_size: int = 500  # rows per INSERT batch (and per outbox read)
    drain_interval_s: float = 0.5  # how often the outbox is drained when it was empty
    timeout_s: float = 5.0  # connect / statement timeout of the database
    pool_size: int = 4  # connections per process (PostgreSQL)
    migrate: bool = True  # run the schema migrations at start-up (under an advisory lock)
    reconcile_interval_s: float = 3600.0  # background reconciliation; 0 = off
    reconcile_window_hours: int = 48  # hours (ending now) the background job compares

    def __post_init__(self) -> None:
        if self.database_url is not None and not self.database_url.startswith(_DB_SCHEMES):
            raise ConfigError.for_variable(
                "BILLING_DATABASE_URL", "must be a postgresql:// or sqlite:/// URL"
            )
        if not 1 <= self.batch_size <= 10_000:
            raise ConfigError.for_variable("BILLING_OUTBOX_BATCH", "must be in 1..10000")
        if self.drain_interval_s <= 0:
            raise ConfigError.for_variable("BILLING_OUTBOX_INTERVAL_S", "must be > 0")
        if self.timeout_s <= 0:
            raise ConfigError.for_variable("BILLING_DATABASE_TIMEOUT_S", "must be > 0")
        if not 1 <= self.pool_size <= 100:
            raise ConfigError.for_variable("BILLING_DATABASE_POOL_SIZE", "must be in 1..100")
        if self.reconcile_interval_s < 0:
            raise ConfigError.for_variable("BILLING_RECONCILE_INTERVAL_S", "must be >= 0")
        if not 1 <= self.reconcile_window_hours <= 24 * 366:
            raise ConfigError.for_variable("BILLING_RECONCILE_WINDOW_HOURS", "must be in 1..8784")

    @property
    def enabled(self) -> bool:
        return self.database_url is not None

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        return cls(
            database_url=env_str(environ, "BILLING_DATABASE_URL"),
            batch_size=env_int(environ, "BILLING_OUTBOX_BATCH", 500, min_value=1, max_value=10_000),
            drain_interval_s=env_float(
                environ, "BILLING_OUTBOX_INTERVAL_S", 0.5, min_value=0.01, max_value=60.0
            ),
            timeout_s=env_float(
                environ, "BILLING_DATABASE_TIMEOUT_S", 5.0, min_value=0.1, max_value=300.0
            ),
            pool_size=env_int(environ, "BILLING_DATABASE_POOL_SIZE", 4, min_value=1, max_value=100),
            migrate=env_bool(environ, "BILLING_DATABASE_MIGRATE", True),
            reconcile_interval_s=env_float(
                environ, "BILLING_RECONCILE_INTERVAL_S", 3600.0, min_value=0.0, max_value=86_400.0
            ),
            reconcile_window_hours=env_int(
                environ, "BILLING_RECONCILE_WINDOW_HOURS", 48, min_value=1, max_value=24 * 366
            ),
        )


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the billing service (and its export/restore commands) needs."""

    server: ServerSettings
    redis: RedisSettings
    prices_config: Path = Path(DEFAULT_PRICES_CONFIG)
    ledger: LedgerSettings = field(default_factory=LedgerSettings)
    limits: Limits = field(default_factory=Limits)
    workers: int = 1  # server processes sharing GRPC_PORT (see workers.py)
    usage_store: UsageStoreSettings = field(default_factory=UsageStoreSettings)

    def __post_init__(self) -> None:
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ConfigError.for_variable("BILLING_WORKERS", f"must be in 1..{MAX_WORKERS}")

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        """Read GRPC_PORT, METRICS_PORT, ... (see ServerSettings), REDIS_URL, PRICES_CONFIG and
        BILLING_* (BILLING_WORKERS: server processes); ConfigError names the offending variable."""
        server = ServerSettings.from_env(
            environ,
            service_name=SERVICE_NAME,
            default_grpc_port=DEFAULT_GRPC_PORT,
            default_metrics_port=DEFAULT_METRICS_PORT,
        )
        return cls(
            server=server,
            redis=RedisSettings.from_env(environ),
            prices_config=Path(env_str(environ, "PRICES_CONFIG", DEFAULT_PRICES_CONFIG)),
            ledger=LedgerSettings.from_env(environ),
            limits=Limits.from_env(environ),
            workers=env_int(environ, "BILLING_WORKERS", 1, min_value=1, max_value=MAX_WORKERS),
            usage_store=UsageStoreSettings.from_env(environ),
        )
