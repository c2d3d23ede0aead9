"""Envoy rate-limit requests as plain values: validated descriptors with their hit counts."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from llm_common.validation import Violations, check_repeated, check_text

MAX_DOMAIN_BYTES = 128
MAX_DESCRIPTORS = 16
MAX_ENTRIES = 8
MAX_ENTRY_KEY_BYTES = 64
MAX_ENTRY_VALUE_BYTES = 256
MAX_HITS = 1_000_000_000
# envoy.type.v3.RateLimitUnit -> seconds (months and years as fixed lengths).
UNIT_SECONDS = {
    1: 1.0,
    2: 60.0,
    3: 3600.0,
    4: 86400.0,
    7: 604800.0,
    5: 2_592_000.0,
    6: 31_536_000.0,
}
SECONDS_UNIT = {seconds: unit for unit, seconds in UNIT_SECONDS.items()}


@dataclass(frozen=True, slots=True)
class Override:
    """A limit carried by the descriptor itself (Envoy's `limit` override)."""

    limit: int
    period_s: float


@dataclass(frozen=True, slots=True)
class Descriptor:
    """One descriptor: its entries, the units it charges (0 = check only) and any override."""

    entries: tuple[tuple[str, str], ...]
    hits: int
    override: Override | None = None

    def get(self, key: str) -> str | None:
        for entry_key, value in self.entries:
            if entry_key == key:
                return value
        return None

    def fingerprint(self, domain: str) -> str:
        """A stable id of domain + entries + override, used to name an override's bucket."""
        text = repr((domain, self.entries, self.override))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def parse_request(request: Any) -> tuple[str, list[Descriptor]]:
    """Domain and descriptors of an envoy.service.ratelimit.v3.RateLimitRequest;
    InvalidArgument listing every problem."""
    v = Violations()
    check_text(v, "domain", request.domain, MAX_DOMAIN_BYTES)
    v.require(request.hits_addend <= MAX_HITS, "hits_addend", f"must be <= {MAX_HITS}")
    sized = check_repeated(
        v, "descriptors", request.descriptors, max_items=MAX_DESCRIPTORS, min_items=1
    )
    # A request-level addend of 0 means 1 (Envoy's convention); per descriptor 0 = check only.
    default_hits = request.hits_addend or 1
    descriptors = [
        _descriptor(v, f"descriptors[{i}]", d, default_hits)
        for i, d in enumerate(request.descriptors if sized else ())
    ]
    v.raise_if_any()
    return request.domain, descriptors


def _descriptor(v: Violations, field: str, d: Any, default_hits: int) -> Descriptor:
    check_repeated(v, f"{field}.entries", d.entries, max_items=MAX_ENTRIES, min_items=1)
    entries = []
    for j, entry in enumerate(d.entries[:MAX_ENTRIES]):
        check_text(v, f"{field}.entries[{j}].key", entry.key, MAX_ENTRY_KEY_BYTES)
        check_text(v, f"{field}.entries[{j}].value", entry.value, MAX_ENTRY_VALUE_BYTES)
        entries.append((entry.key, entry.value))
    hits = d.hits_addend.value if d.HasField("hits_addend") else default_hits
    v.require(hits <= MAX_HITS, f"{field}.hits_addend", f"must be <= {MAX_HITS}")
    return Descriptor(tuple(entries), hits, _override(v, field, d))


def _override(v: Violations, field: str, d: Any) -> Override | None:
    if not d.HasField("limit"):
        return None
    period = UNIT_SECONDS.get(d.limit.unit)
    v.require(period is not None, f"{field}.limit.unit", "must be a known unit")
    v.require(d.limit.requests_per_unit >= 1, f"{field}.limit.requests_per_unit", "must be >= 1")
    if period is None or d.limit.requests_per_unit < 1:
        return None
    return Override(limit=d.limit.requests_per_unit, period_s=period)
