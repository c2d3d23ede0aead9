"""The price book: validation, effective dates, and the repository's prices.yaml."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from llm_billing.prices import load_prices, parse_prices
from llm_common.config import ConfigError
from llm_common.models_config import load_catalog

ROOT = Path(__file__).resolve().parents[4]


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).astimezone(UTC).timestamp()) * 1000


def entry(**overrides: Any) -> dict[str, Any]:
    base = {
        "model": "m",
        "effective_from": "2025-01-01T00:00:00Z",
        "input_micros_per_mtok": 100,
        "output_micros_per_mtok": 200,
        "cached_input_micros_per_mtok": 50,
    }
    return {**base, **overrides}


def test_price_in_force_follows_effective_dates() -> None:
    book = parse_prices(
        {
            "prices": [
                entry(effective_from="2026-06-01T00:00:00Z", input_micros_per_mtok=120),
                entry(),
            ]
        },
        "USD",
    )
    assert book.currency == "USD"
    assert book.at("m", ms("2024-12-31T23:59:59+00:00")) is None  # not priced yet
    first = book.at("m", ms("2025-01-01T00:00:00+00:00"))
    assert first is not None
    assert first.input_micros_per_mtok == 100
    before = book.at("m", ms("2026-06-01T00:00:00+00:00") - 1)
    assert before is not None
    assert before.input_micros_per_mtok == 100
    after = book.at("m", ms("2026-06-01T00:00:00+00:00"))
    assert after is not None
    assert after.input_micros_per_mtok == 120
    assert book.at("other", ms("2026-01-01T00:00:00+00:00")) is None


def test_listing_shows_current_and_scheduled_prices_only() -> None:
    book = parse_prices(
        {
            "prices": [
                entry(effective_from="2024-01-01T00:00:00Z"),
                entry(effective_from="2025-01-01T00:00:00Z"),
                entry(effective_from="2030-01-01T00:00:00Z"),
                entry(model="n"),
            ]
        },
        "USD",
    )
    listed = book.current_and_scheduled(ms("2026-01-01T00:00:00+00:00"))
    assert [(p.model, p.effective_from_ms) for p in listed] == [
        ("m", ms("2025-01-01T00:00:00+00:00")),
        ("m", ms("2030-01-01T00:00:00+00:00")),
        ("n", ms("2025-01-01T00:00:00+00:00")),
    ]
    assert [p.model for p in book.current_and_scheduled(0, "n")] == ["n"]  # scheduled
    assert book.current_and_scheduled(0, "unknown") == []


def test_unquoted_yaml_timestamps_and_offsets_are_understood() -> None:
    raw = yaml.safe_load(
        "prices:\n  - model: m\n    effective_from: 2025-01-01T02:00:00+02:00\n"
        "    input_micros_per_mtok: 1\n    output_micros_per_mtok: 2\n"
        "    cached_input_micros_per_mtok: 1\n"
    )
    book = parse_prices(raw, "EUR")
    assert book.currency == "EUR"
    assert book.by_model["m"][0].effective_from_ms == ms("2025-01-01T00:00:00+00:00")


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({}, "prices"),
        ({"prices": []}, "prices"),
        ({"prices": [entry(model="bad model")]}, "model"),
        ({"prices": [entry(input_micros_per_mtok=-1)]}, "input_micros_per_mtok"),
        ({"prices": [entry(input_micros_per_mtok=1.5)]}, "integer"),
        ({"prices": [entry(output_micros_per_mtok=True)]}, "integer"),
        ({"prices": [entry(cached_input_micros_per_mtok=10**13)]}, "cached_input"),
        ({"prices": [entry(effective_from="yesterday")]}, "RFC 3339"),
        ({"prices": [entry(effective_from="2025-01-01T00:00:00")]}, "time zone"),
        ({"prices": [entry(effective_from=None)]}, "effective_from"),
        ({"prices": [entry(), entry()]}, "share an effective_from"),
        ({"prices": [entry(currency="EUR")]}, "currency"),
        ({"currency": "usd", "prices": [entry()]}, "ISO 4217"),
    ],
)
def test_invalid_prices_are_rejected(document: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_prices(document, "USD")


def test_load_names_the_variable_and_file(tmp_path: Path) -> None:
    missing = tmp_path / "none.yaml"
    with pytest.raises(ConfigError, match="PRICES_CONFIG") as info:
        load_prices(missing, "USD")
    assert str(missing) in str(info.value)
    broken = tmp_path / "broken.yaml"
    broken.write_text("prices: [model: x", encoding="utf-8")
    with pytest.raises(ConfigError, match="PRICES_CONFIG"):
        load_prices(broken, "USD")


def test_repository_prices_cover_every_served_model() -> None:
    book = load_prices(ROOT / "infra" / "config" / "prices.yaml", "USD")
    catalog = load_catalog(ROOT / "infra" / "config" / "models.yaml", ROOT / ".cache" / "models")
    now = ms("2100-01-01T00:00:00+00:00")
    unpriced = [name for name in catalog.names() if book.at(name, now) is None]
    assert unpriced == [], f"models without a price in infra/config/prices.yaml: {unpriced}"
