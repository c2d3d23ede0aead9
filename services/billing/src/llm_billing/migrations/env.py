"""Alembic environment: the connection passed in by `usagedb.upgrade`, or BILLING_DATABASE_URL
(`alembic -c services/billing/alembic.ini upgrade head`)."""

from __future__ import annotations

import os

import sqlalchemy as sa
from alembic import context

from llm_billing.usagedb import driver_url, metadata

config = context.config


def _run(connection: sa.Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("BILLING_DATABASE_URL")
    if not url:
        raise SystemExit("BILLING_DATABASE_URL: is required to run the migrations")
    engine = sa.create_engine(driver_url(url))
    with engine.connect() as conn:
        _run(conn)
        conn.commit()
    engine.dispose()
