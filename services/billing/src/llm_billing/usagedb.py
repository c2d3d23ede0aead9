"""The durable SQL usage store: tables, engine (PostgreSQL or SQLite), migrations, batch upsert.

SQLAlchemy 2 Core (no ORM) over psycopg 3 for PostgreSQL and the standard library's sqlite3
for SQLite (WAL). Every call here is blocking: the async callers run them in a thread
(`asyncio.to_thread`), off the request path. The database URL may carry a password: it is
never logged (`safe_url`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine, make_url

from llm_billing.config import UsageStoreSettings
from llm_common.config import ConfigError

# pg_advisory_lock key of the schema migrations ("billing" in ASCII, fits a bigint).
MIGRATION_LOCK_KEY = 0x62696C6C696E67
# A newer outcome of a request replaces an older one, never the reverse (see STATUS_REVISION).
STATUS_REVISION = {"expired": 1, "released": 2, "settled": 3, "corrected": 3, "unreserved": 3}
CHARGED = ("expired", "settled", "corrected", "unreserved")  # released rows charge nothing


class UTCDateTime(sa.types.TypeDecorator[datetime]):
    """Aware UTC datetimes on every dialect (SQLite stores naive text: UTC by convention)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: sa.Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


metadata = sa.MetaData()

usage_records = sa.Table(
    "usage_records",
    metadata,
    sa.Column("request_id", sa.String(128), primary_key=True),  # unique: one row per request
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("key_id", sa.String(64), nullable=False),
    sa.Column("model", sa.String(128), nullable=False),
    sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
    sa.Column("cached_tokens", sa.BigInteger, nullable=False),
    sa.Column("completion_tokens", sa.BigInteger, nullable=False),
    sa.Column("cost_micros", sa.BigInteger, nullable=False),
    sa.Column("currency", sa.String(3), nullable=False),
    sa.Column("price_version", sa.BigInteger, nullable=False),  # price's effective_from, ms
    sa.Column("started_at", UTCDateTime, nullable=False),  # admission
    sa.Column("settled_at", UTCDateTime, nullable=False),  # settle, expiry or refund
    sa.Column("started_hour", sa.BigInteger, nullable=False),  # UTC hours since the epoch
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("revision", sa.SmallInteger, nullable=False),
    sa.Column("finish_reason", sa.SmallInteger, nullable=False),
    sa.Index("ix_usage_records_tenant_hour", "tenant_id", "started_hour"),
)

invoices = sa.Table(
    "invoices",
    metadata,
    sa.Column("invoice_id", sa.String(96), primary_key=True),  # inv-<tenant>-<YYYY-MM>
    sa.Column("tenant_id", sa.String(64), nullable=False),
    sa.Column("month", sa.String(7), nullable=False),  # YYYY-MM
    sa.Column("currency", sa.String(3), nullable=False),
    sa.Column("requests", sa.BigInteger, nullable=False),
    sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
    sa.Column("cached_tokens", sa.BigInteger, nullable=False),
    sa.Column("completion_tokens", sa.BigInteger, nullable=False),
    sa.Column("total_micros", sa.BigInteger, nullable=False),
    sa.Column("issued_at", UTCDateTime, nullable=False),
    sa.UniqueConstraint("tenant_id", "month", name="uq_invoices_tenant_month"),
)

invoice_lines = sa.Table(
    "invoice_lines",
    metadata,
    sa.Column("invoice_id", sa.String(96), sa.ForeignKey("invoices.invoice_id"), primary_key=True),
    sa.Column("key_id", sa.String(64), primary_key=True),
    sa.Column("model", sa.String(128), primary_key=True),
    sa.Column("requests", sa.BigInteger, nullable=False),
    sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
    sa.Column("cached_tokens", sa.BigInteger, nullable=False),
    sa.Column("completion_tokens", sa.BigInteger, nullable=False),
    sa.Column("cost_micros", sa.BigInteger, nullable=False),
)


@dataclass(frozen=True, slots=True)
class UsageRow:
    """One request's final usage, as the outbox carries it."""

    request_id: str
    tenant_id: str
    key_id: str
    model: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost_micros: int
    currency: str
    price_version: int
    started_at_ms: int
    settled_at_ms: int
    started_hour: int
    status: str
    finish_reason: int = 0

    def values(self) -> dict[str, Any]:
        return {
            "request_id": self.request_id,
            "tenant_id": self.tenant_id,
            "key_id": self.key_id,
            "model": self.model,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "completion_tokens": self.completion_tokens,
            "cost_micros": self.cost_micros,
            "currency": self.currency,
            "price_version": self.price_version,
            "started_at": ms_datetime(self.started_at_ms),
            "settled_at": ms_datetime(self.settled_at_ms),
            "started_hour": self.started_hour,
            "status": self.status,
            "revision": STATUS_REVISION[self.status],
            "finish_reason": self.finish_reason,
        }


def ms_datetime(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)


def datetime_ms(value: datetime) -> int:
    return round(value.timestamp() * 1000)


def safe_url(url: str) -> str:
    """The URL without its password, for logs and messages."""
    return make_url(url).render_as_string(hide_password=True)


def driver_url(url: str) -> str:
    """postgresql:// and postgres:// select psycopg 3; sqlite:/// stays."""
    for scheme in ("postgresql://", "postgres://"):
        if url.startswith(scheme):
            return "postgresql+psycopg://" + url[len(scheme) :]
    return url


def make_engine(settings: UsageStoreSettings) -> Engine:
    """A pooled engine; nothing connects until first use."""
    if settings.database_url is None:
        raise ConfigError.for_variable("BILLING_DATABASE_URL", "is required for the usage store")
    url = driver_url(settings.database_url)
    if url.startswith("sqlite"):
        return _sqlite_engine(url, settings.timeout_s)
    timeout_ms = round(settings.timeout_s * 1000)
    return sa.create_engine(
        url,
        pool_size=settings.pool_size,
        max_overflow=0,
        pool_timeout=settings.timeout_s,
        pool_pre_ping=True,  # a connection broken by a database restart is replaced
        pool_recycle=600,
        connect_args={
            "connect_timeout": max(1, round(settings.timeout_s)),
            "options": f"-c statement_timeout={timeout_ms} -c lock_timeout={timeout_ms}",
            "application_name": "llm-billing",
        },
    )


def _sqlite_engine(url: str, timeout_s: float) -> Engine:
    path = make_url(url).database
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = sa.create_engine(url, connect_args={"timeout": timeout_s})

    @sa.event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")  # a committed batch survives a power cut
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return engine


def _upsert(dialect: str) -> Any:
    """INSERT ... ON CONFLICT (request_id) DO UPDATE only when the row is an older outcome:
    a replay of the same outcome (or an older one) changes nothing."""
    insert = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = insert(usage_records)
    columns = [c.name for c in usage_records.columns if c.name != "request_id"]
    return stmt.on_conflict_do_update(
        index_elements=[usage_records.c.request_id],
        set_={name: stmt.excluded[name] for name in columns},
        where=usage_records.c.revision < stmt.excluded.revision,
    )


def latest_per_request(rows: Sequence[UsageRow]) -> list[UsageRow]:
    """One row per request id, its newest outcome (one statement may not touch a row twice)."""
    best: dict[str, UsageRow] = {}
    for row in rows:
        old = best.get(row.request_id)
        if old is None or STATUS_REVISION[row.status] >= STATUS_REVISION[old.status]:
            best[row.request_id] = row
    return list(best.values())


class UsageStore:
    """Blocking access to the usage tables (call from a thread)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._upsert = _upsert(engine.dialect.name)

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def write(self, rows: Sequence[UsageRow]) -> int:
        """Upsert a batch in one transaction; returns the rows sent."""
        batch = latest_per_request(rows)
        if batch:
            with self.engine.begin() as conn:
                conn.execute(self._upsert, [row.values() for row in batch])
        return len(batch)

    def ping(self) -> None:
        with self.engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))

    def dispose(self) -> None:
        self.engine.dispose()


def migrations_folder() -> str:
    return str(resources.files("llm_billing") / "migrations")


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Run the Alembic migrations up to `revision`, under an advisory lock (one process at a
    time: the others wait, then find the schema current)."""
    from alembic import command
    from alembic.config import Config

    # Alembic announces each of its plugins at INFO: keep its migration lines only.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    with _migration_lock(engine) as conn:
        config = Config()
        config.set_main_option("script_location", migrations_folder())
        config.attributes["connection"] = conn
        command.upgrade(config, revision)
        conn.commit()


@contextlib.contextmanager
def _migration_lock(engine: Engine) -> Iterator[Connection]:
    with engine.connect() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATION_LOCK_KEY})
            conn.commit()
            try:
                yield conn
            finally:
                conn.rollback()
                conn.execute(sa.text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATION_LOCK_KEY})
                conn.commit()
            return
        database = engine.url.database
        lock_path = Path(f"{database}.migrate-lock") if database not in (None, ":memory:") else None
        if lock_path is None:
            yield conn
            return
        with lock_path.open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield conn
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)


def current_revision(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
