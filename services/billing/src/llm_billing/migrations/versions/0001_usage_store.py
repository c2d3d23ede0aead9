"""usage_records, invoices and invoice_lines

Revision ID: 0001
Revises:
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from llm_billing.usagedb import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def _token_columns() -> list[sa.Column[int]]:
    return [
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
        sa.Column("cached_tokens", sa.BigInteger, nullable=False),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False),
    ]


def upgrade() -> None:
    op.create_table(
        "usage_records",
        sa.Column("request_id", sa.String(128), primary_key=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        *_token_columns(),
        sa.Column("cost_micros", sa.BigInteger, nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("price_version", sa.BigInteger, nullable=False),
        sa.Column("started_at", UTCDateTime, nullable=False),
        sa.Column("settled_at", UTCDateTime, nullable=False),
        sa.Column("started_hour", sa.BigInteger, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("revision", sa.SmallInteger, nullable=False),
        sa.Column("finish_reason", sa.SmallInteger, nullable=False),
    )
    op.create_index("ix_usage_records_tenant_hour", "usage_records", ["tenant_id", "started_hour"])
    op.create_table(
        "invoices",
        sa.Column("invoice_id", sa.String(96), primary_key=True),
        sa.Column("tenant_id", sa.String(64), nullable=False),
        sa.Column("month", sa.String(7), nullable=False),
        sa.Column("currency", sa.String(3), nullable=False),
        sa.Column("requests", sa.BigInteger, nullable=False),
        *_token_columns(),
        sa.Column("total_micros", sa.BigInteger, nullable=False),
        sa.Column("issued_at", UTCDateTime, nullable=False),
        sa.UniqueConstraint("tenant_id", "month", name="uq_invoices_tenant_month"),
    )
    op.create_table(
        "invoice_lines",
        sa.Column(
            "invoice_id", sa.String(96), sa.ForeignKey("invoices.invoice_id"), primary_key=True
        ),
        sa.Column("key_id", sa.String(64), primary_key=True),
        sa.Column("model", sa.String(128), primary_key=True),
        sa.Column("requests", sa.BigInteger, nullable=False),
        *_token_columns(),
        sa.Column("cost_micros", sa.BigInteger, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("invoice_lines")
    op.drop_table("invoices")
    op.drop_index("ix_usage_records_tenant_hour", table_name="usage_records")
    op.drop_table("usage_records")
