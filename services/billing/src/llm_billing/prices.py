"""The price book (PRICES_CONFIG): model prices in micros per 1M tokens, with effective dates."""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from llm_common.config import ConfigError

# $1,000,000 per 1M tokens; above it token x price products could leave exact integer range.
MAX_PRICE_MICROS_PER_MTOK = 10**12
MODEL_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@-]{0,127}")
_CURRENCY = re.compile(r"[A-Z]{3}")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_PRICE_FIELDS = (
    "input_micros_per_mtok",
    "output_micros_per_mtok",
    "cached_input_micros_per_mtok",
)


@dataclass(frozen=True, slots=True)
class Price:
    """One model's price from `effective_from_ms` on, in micros of `currency` per 1M tokens."""

    model: str
    input_micros_per_mtok: int
    output_micros_per_mtok: int
    cached_input_micros_per_mtok: int
    currency: str
    effective_from_ms: int


@dataclass(frozen=True, slots=True)
class PriceBook:
    """Every model's prices, each model's sorted by effective time; one currency."""

    currency: str
    by_model: Mapping[str, tuple[Price, ...]]

    def at(self, model: str, at_ms: int) -> Price | None:
        """The price in force for requests admitted at `at_ms`, or None (unpriced then)."""
        prices = self.by_model.get(model)
        if not prices:
            return None
        index = bisect.bisect_right([p.effective_from_ms for p in prices], at_ms) - 1
        return prices[index] if index >= 0 else None

    def current_and_scheduled(self, now_ms: int, model: str | None = None) -> list[Price]:
        """The price in force now and every later one, per model (all models when None)."""
        models = sorted(self.by_model) if model is None else [model]
        listed: list[Price] = []
        for name in models:
            current = self.at(name, now_ms)
            listed += [
                p
                for p in self.by_model.get(name, ())
                if p is current or p.effective_from_ms > now_ms
            ]
        return listed


def load_prices(path: Path, default_currency: str) -> PriceBook:
    """Read and validate PRICES_CONFIG; ConfigError names the file and the bad entry."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError.for_variable("PRICES_CONFIG", f"cannot read {path}: {exc}") from exc
    try:
        return parse_prices(raw, default_currency)
    except ValueError as exc:
        raise ConfigError.for_variable("PRICES_CONFIG", f"{path}: {exc}") from exc


def parse_prices(raw: Any, default_currency: str) -> PriceBook:
    """A PriceBook from the parsed YAML document; ValueError on any invalid entry."""
    if not isinstance(raw, dict) or not isinstance(raw.get("prices"), list) or not raw["prices"]:
        raise ValueError("needs a non-empty `prices` list")
    currency = str(raw.get("currency", default_currency))
    if not _CURRENCY.fullmatch(currency):
        raise ValueError(f"currency must be an ISO 4217 code such as USD, got {currency!r}")
    prices = [_parse_price(entry, currency) for entry in raw["prices"]]
    return PriceBook(currency=currency, by_model=_index(prices))


def _parse_price(entry: Any, currency: str) -> Price:
    if not isinstance(entry, dict):
        raise ValueError(f"each price must be a mapping, got {entry!r}")
    model = entry.get("model")
    if not isinstance(model, str) or not MODEL_PATTERN.fullmatch(model):
        raise ValueError(f"invalid model name {model!r}")
    own_currency = entry.get("currency", currency)
    if own_currency != currency:
        # Budgets and invoices add amounts up, so they must share a currency.
        raise ValueError(f"model {model}: currency {own_currency!r} differs from {currency!r}")
    amounts = {name: _amount(entry, name, model) for name in _PRICE_FIELDS}
    return Price(
        model=model,
        currency=currency,
        effective_from_ms=_effective_from(entry.get("effective_from"), model),
        **amounts,
    )


def _amount(entry: Mapping[str, Any], name: str, model: str) -> int:
    value = entry.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"model {model}: {name} must be an integer number of micros")
    if not 0 <= value <= MAX_PRICE_MICROS_PER_MTOK:
        raise ValueError(f"model {model}: {name} must be in 0..{MAX_PRICE_MICROS_PER_MTOK}")
    return value


def _effective_from(value: Any, model: str) -> int:
    if isinstance(value, datetime):  # YAML turns unquoted timestamps into datetimes
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError(f"model {model}: effective_from {value!r} is not RFC 3339") from None
    else:
        raise ValueError(f"model {model}: effective_from is required (RFC 3339, UTC)")
    if moment.tzinfo is None:
        raise ValueError(f"model {model}: effective_from needs a time zone (e.g. Z)")
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def _index(prices: Sequence[Price]) -> dict[str, tuple[Price, ...]]:
    by_model: dict[str, list[Price]] = {}
    for price in prices:
        by_model.setdefault(price.model, []).append(price)
    indexed: dict[str, tuple[Price, ...]] = {}
    for model, entries in by_model.items():
        entries.sort(key=lambda p: p.effective_from_ms)
        starts = [p.effective_from_ms for p in entries]
        if len(set(starts)) != len(starts):
            raise ValueError(f"model {model}: two prices share an effective_from")
        indexed[model] = tuple(entries)
    return indexed
