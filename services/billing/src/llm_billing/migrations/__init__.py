"""Alembic migrations of the usage store (see usagedb.upgrade and services/billing/alembic.ini)."""
