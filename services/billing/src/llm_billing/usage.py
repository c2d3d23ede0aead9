"""Usage queries over the hourly and daily counters: tokens and cost per bucket."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import redis.asyncio

from llm_billing.keys import KeySpace, dimension, usage_fields
from llm_billing.timeutil import DAY_MS, HOUR_MS

PIPELINE_CHUNK = 500


class Granularity(enum.Enum):
    """Bucket size of a usage query."""

    HOUR = "hour"
    DAY = "day"
    TOTAL = "total"


@dataclass(frozen=True, slots=True)
class UsageTotals:
    """Counters of one bucket (costs in micros)."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    cost_micros: int = 0

    def __add__(self, other: UsageTotals) -> UsageTotals:
        return UsageTotals(
            self.requests + other.requests,
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.cached_tokens + other.cached_tokens,
            self.cost_micros + other.cost_micros,
        )

    def is_empty(self) -> bool:
        return not any(
            (
                self.requests,
                self.prompt_tokens,
                self.completion_tokens,
                self.cached_tokens,
                self.cost_micros,
            )
        )


@dataclass(frozen=True, slots=True)
class UsageQuery:
    """Usage of a tenant, optionally of one key and/or model, in [start_ms, end_ms)."""

    tenant_id: str
    key_id: str
    model: str
    start_ms: int
    end_ms: int
    granularity: Granularity


@dataclass(frozen=True, slots=True)
class UsageBucket:
    start_ms: int
    totals: UsageTotals


@dataclass(frozen=True, slots=True)
class UsageReport:
    buckets: tuple[UsageBucket, ...]  # non-empty ones, oldest first
    total: UsageTotals


@dataclass(frozen=True, slots=True)
class _Read:
    """One counter hash to read and the bucket it adds to."""

    key: str
    bucket_start_ms: int


class UsageReader:
    """Reads the counters the ledger scripts maintain."""

    def __init__(self, client: redis.asyncio.Redis, keys: KeySpace) -> None:
        self._client = client
        self._keys = keys

    async def usage(self, q: UsageQuery) -> UsageReport:
        reads = self._plan(q)
        values = await self._read(reads, usage_fields(dimension(q.key_id, q.model)))
        by_start: dict[int, UsageTotals] = {}
        for read, totals in zip(reads, values, strict=True):
            start = read.bucket_start_ms
            by_start[start] = by_start.get(start, UsageTotals()) + totals
        buckets = tuple(
            UsageBucket(start, totals)
            for start, totals in sorted(by_start.items())
            if not totals.is_empty()
        )
        total = sum((b.totals for b in buckets), UsageTotals())
        return UsageReport(buckets, total)

    def _plan(self, q: UsageQuery) -> list[_Read]:
        tenant = q.tenant_id
        if q.granularity is Granularity.DAY:
            return [
                _Read(self._keys.usage_day(tenant, d), d * DAY_MS)
                for d in _ids_starting_in(q.start_ms, q.end_ms, DAY_MS)
            ]
        hours = _ids_starting_in(q.start_ms, q.end_ms, HOUR_MS)
        if q.granularity is Granularity.HOUR:
            return [_Read(self._keys.usage_hour(tenant, h), h * HOUR_MS) for h in hours]
        return [_Read(key, q.start_ms) for key in self._total_keys(tenant, hours)]

    def _total_keys(self, tenant: str, hours: range) -> list[str]:
        """Day counters for whole UTC days in the range, hour counters at its edges."""
        keys, hour = [], hours.start
        while hour < hours.stop:
            if hour % 24 == 0 and hour + 24 <= hours.stop:
                keys.append(self._keys.usage_day(tenant, hour // 24))
                hour += 24
            else:
                keys.append(self._keys.usage_hour(tenant, hour))
                hour += 1
        return keys

    async def _read(self, reads: Sequence[_Read], fields: list[str]) -> list[UsageTotals]:
        totals: list[UsageTotals] = []
        for start in range(0, len(reads), PIPELINE_CHUNK):
            async with self._client.pipeline(transaction=False) as pipe:
                for read in reads[start : start + PIPELINE_CHUNK]:
                    pipe.hmget(read.key, fields)
                rows = await pipe.execute()
            totals += [UsageTotals(*(int(v or 0) for v in row)) for row in rows]
        return totals


def _ids_starting_in(start_ms: int, end_ms: int, size_ms: int) -> range:
    """Bucket ids whose start lies in [start_ms, end_ms)."""
    return range(-(-start_ms // size_ms), -(-end_ms // size_ms))
