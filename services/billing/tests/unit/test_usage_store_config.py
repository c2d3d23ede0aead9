"""Usage store settings: every variable validated with an error naming it; outbox entries
parsed into rows; one row per request in a batch (the newest outcome)."""

from __future__ import annotations

import pytest

from llm_billing.config import UsageStoreSettings
from llm_billing.usage_outbox import parse_entry
from llm_billing.usagedb import driver_url, latest_per_request, safe_url
from llm_common.config import ConfigError


def test_off_by_default_and_read_from_the_environment() -> None:
    assert not UsageStoreSettings.from_env({}).enabled
    s = UsageStoreSettings.from_env(
        {
            "BILLING_DATABASE_URL": "postgresql://u:secret@db:5432/billing",
            "BILLING_OUTBOX_BATCH": "200",
            "BILLING_RECONCILE_INTERVAL_S": "0",
            "BILLING_DATABASE_MIGRATE": "false",
        }
    )
    assert s.enabled
    assert (s.batch_size, s.reconcile_interval_s, s.migrate) == (200, 0.0, False)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("BILLING_DATABASE_URL", "mysql://db/billing"),
        ("BILLING_OUTBOX_BATCH", "0"),
        ("BILLING_OUTBOX_INTERVAL_S", "-1"),
        ("BILLING_DATABASE_TIMEOUT_S", "x"),
        ("BILLING_DATABASE_POOL_SIZE", "1000"),
        ("BILLING_DATABASE_MIGRATE", "maybe"),
        ("BILLING_RECONCILE_INTERVAL_S", "-5"),
        ("BILLING_RECONCILE_WINDOW_HOURS", "0"),
    ],
)
def test_bad_values_name_their_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as err:
        UsageStoreSettings.from_env({variable: value})
    assert str(err.value).startswith(f"{variable}:")
    assert "\n" not in str(err.value)


def test_urls_select_psycopg_and_hide_passwords() -> None:
    assert driver_url("postgresql://u:p@h/db") == "postgresql+psycopg://u:p@h/db"
    assert driver_url("postgres://h/db") == "postgresql+psycopg://h/db"
    assert driver_url("sqlite:///x.db") == "sqlite:///x.db"
    assert "secret" not in safe_url("postgresql://u:secret@h/db")


def entry(state: str, **extra: str) -> dict[str, str]:
    fields = {"r": "r1", "st": state, "k": "k", "m": "small", "pt": "10", "ct": "5", "ch": "2"}
    fields |= {"c": "7", "cur": "USD", "pf": "0", "at": "3600000", "sa": "3600500", "hb": "1"}
    return fields | extra


def test_entries_become_rows() -> None:
    row = parse_entry("acme", entry("S", cr="1", fr="1"))
    assert (row.tenant_id, row.status, row.cost_micros, row.started_hour) == (
        "acme",
        "corrected",
        7,
        1,
    )
    assert parse_entry("acme", entry("S", cr="0")).status == "settled"
    assert parse_entry("acme", entry("E")).status == "expired"
    assert parse_entry("acme", entry("X")).status == "released"


def test_a_batch_keeps_each_requests_newest_outcome() -> None:
    expired, settled = parse_entry("a", entry("E")), parse_entry("a", entry("S"))
    released = parse_entry("a", entry("X"))
    assert latest_per_request([settled, expired]) == [settled]
    assert latest_per_request([expired, released]) == [released]
    assert latest_per_request([expired, released, settled]) == [settled]
