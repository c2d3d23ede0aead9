"""Usage store benchmark -> bench/results/usage_store.json.

1. Batched writes: rows per second upserted into `usage_records` on PostgreSQL (a scratch
   database on --postgres, default postgresql://postgres@127.0.0.1:5432) and SQLite (WAL,
   synchronous=FULL, a temporary file), in batches of the drainer's default size.
2. Outbox drain: 10,000 rows spooled in the Redis outbox streams (20 tenants) by real
   Settles (the ledger's scripts, no reservation), then drained into each database; the time
   from the first read to an empty outbox.
3. The settle path with the store on vs off, in the same run and alternating rounds: the
   in-process `Ledger.settle` of reserved requests (one Redis round trip), concurrency 1 and
   16, p50/p99; with the store on, the settle script also appends to the outbox and the
   drainer runs in the same process, as in billing.

Run from the repository root: `.venv/bin/python bench/bench_usage_store.py`.
Goal: the store adds <= 0.2 ms to the settle path at p50 (it is off the request path).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import redis.asyncio
import sqlalchemy as sa
from prometheus_client import CollectorRegistry

from llm_billing.config import LedgerSettings, RedisSettings, UsageStoreSettings
from llm_billing.keys import KeySpace
from llm_billing.ledger import Ledger
from llm_billing.ledger_values import Admission, ReserveInput, SettleInput, Usage
from llm_billing.metrics import BillingMetrics
from llm_billing.prices import PriceBook, load_prices
from llm_billing.store import make_client
from llm_billing.usage_outbox import UsageOutbox
from llm_billing.usagedb import UsageRow, UsageStore, make_engine, upgrade
from llm_testing import redis_url_for_tests

RESULTS = Path("bench/results/usage_store.json")
PRICES = Path("infra/config/prices.yaml")
DEFAULT_PG = "postgresql://postgres@127.0.0.1:5432"
GOAL_P50_ADDED_MS = 0.2


@contextmanager
def databases(pg_server: str) -> Iterator[dict[str, str]]:
    """{'postgresql': url, 'sqlite': url}; PostgreSQL left out when unreachable."""
    urls: dict[str, str] = {}
    name = f"bench_usage_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(
        pg_server.replace("postgresql://", "postgresql+psycopg://") + "/postgres",
        isolation_level="AUTOCOMMIT",
        connect_args={"connect_timeout": 3},
    )
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        urls["postgresql"] = f"{pg_server}/{name}"
    except sa.exc.OperationalError:
        print(f"no PostgreSQL at {pg_server}: SQLite only")
    with tempfile.TemporaryDirectory() as folder:
        urls["sqlite"] = f"sqlite:///{folder}/usage.db"
        try:
            yield urls
        finally:
            if "postgresql" in urls:
                admin.dispose()
                with admin.connect() as conn:
                    conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


def store_for(url: str) -> UsageStore:
    store = UsageStore(make_engine(UsageStoreSettings(database_url=url)))
    upgrade(store.engine)
    return store


def synthetic_rows(n: int, tag: str) -> list[UsageRow]:
    now = int(time.time() * 1000)
    return [
        UsageRow(
            f"{tag}-{i}",
            f"t{i % 20}",
            f"k{i % 3}",
            "demo-llama",
            1000 + i % 97,
            i % 50,
            200 + i % 31,
            1234 + i,
            "USD",
            0,
            now - i,
            now,
            (now - i) // 3_600_000,
            "settled",
            1,
        )
        for i in range(n)
    ]


def bench_writes(store: UsageStore, rows: int, batch: int) -> dict[str, Any]:
    data = synthetic_rows(rows, f"w{uuid.uuid4().hex[:6]}")
    started = time.perf_counter()
    for i in range(0, rows, batch):
        store.write(data[i : i + batch])
    elapsed = time.perf_counter() - started
    replay_started = time.perf_counter()
    for i in range(0, rows, batch):  # the same rows again: idempotent, nothing changes
        store.write(data[i : i + batch])
    replay = time.perf_counter() - replay_started
    return {
        "rows": rows,
        "batch": batch,
        "seconds": round(elapsed, 3),
        "rows_per_s": round(rows / elapsed),
        "replay_rows_per_s": round(rows / replay),
    }


async def spool(ledger: Ledger, n: int, tag: str) -> None:
    """n settles without reservation (20 tenants): each appends one outbox entry."""
    sem = asyncio.Semaphore(64)

    async def one(i: int) -> None:
        async with sem:
            usage = Usage(1000 + i % 97, 200 + i % 31, i % 50, 1)
            admission = Admission(f"k{i % 3}", "demo-llama", None)
            await ledger.settle(SettleInput(f"{tag}-{i}", f"t{i % 20}", usage, admission))

    await asyncio.gather(*(one(i) for i in range(n)))


async def bench_drain(
    client: redis.asyncio.Redis, prefix: str, prices: PriceBook, url: str, n: int
) -> dict[str, Any]:
    keys = KeySpace(prefix)
    ledger = Ledger(client, keys, prices, LedgerSettings(key_prefix=prefix), outbox=True)
    store = store_for(url)
    outbox = UsageOutbox(client, keys, store, BillingMetrics(CollectorRegistry()), batch_size=500)
    try:
        await spool(ledger, n, f"d{uuid.uuid4().hex[:6]}")
        spooled = (await outbox.backlog()).entries
        started = time.perf_counter()
        written = await outbox.drain()
        elapsed = time.perf_counter() - started
        assert (await outbox.backlog()).entries == 0
    finally:
        await ledger.aclose()
        store.dispose()
    return {
        "spooled": spooled,
        "written": written,
        "seconds": round(elapsed, 3),
        "rows_per_s": round(written / elapsed),
    }


def quantiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "n": len(ordered),
        "p50_ms": round(pick(0.50), 4),
        "p90_ms": round(pick(0.90), 4),
        "p99_ms": round(pick(0.99), 4),
        "mean_ms": round(statistics.fmean(ordered), 4),
    }


async def settle_round(ledger: Ledger, n: int, concurrency: int, tag: str) -> list[float]:
    """Reserve n requests, then time each Settle (concurrency workers)."""
    ids = [f"{tag}-{i}" for i in range(n)]
    for start in range(0, n, 64):
        await asyncio.gather(
            *(
                ledger.reserve(ReserveInput(r, "bench", "k", "demo-llama", 500, 100))
                for r in ids[start : start + 64]
            )
        )
    latencies: list[float] = []
    queue = iter(ids)

    async def worker() -> None:
        for rid in queue:
            started = time.perf_counter()
            await ledger.settle(SettleInput(rid, "bench", Usage(500, 80, 0, 1)))
            latencies.append((time.perf_counter() - started) * 1000)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies


async def bench_settle_path(
    client: redis.asyncio.Redis, prefix: str, prices: PriceBook, url: str, args: argparse.Namespace
) -> dict[str, Any]:
    keys = KeySpace(prefix)
    settings = LedgerSettings(key_prefix=prefix)
    off = Ledger(client, keys, prices, settings, outbox=False)
    on = Ledger(client, keys, prices, settings, outbox=True)
    store = store_for(url)
    outbox = UsageOutbox(
        client, keys, store, BillingMetrics(CollectorRegistry()), batch_size=500, interval_s=0.5
    )
    outbox.start()  # the drainer runs beside the settles, as in billing
    results: dict[str, Any] = {}
    try:
        for concurrency in (1, 16):
            samples: dict[str, list[float]] = {"store_off": [], "store_on": []}
            await settle_round(off, 200, concurrency, f"warm{concurrency}")
            for r in range(args.rounds):
                order = [("store_off", off), ("store_on", on)]
                for arm, ledger in order if r % 2 == 0 else order[::-1]:
                    tag = f"s{concurrency}-{arm}-{r}-{uuid.uuid4().hex[:4]}"
                    samples[arm] += await settle_round(ledger, args.settles, concurrency, tag)
            off_q, on_q = quantiles(samples["store_off"]), quantiles(samples["store_on"])
            results[f"concurrency_{concurrency}"] = {
                "store_off": off_q,
                "store_on": on_q,
                "added_p50_ms": round(on_q["p50_ms"] - off_q["p50_ms"], 4),
                "added_p99_ms": round(on_q["p99_ms"] - off_q["p99_ms"], 4),
            }
        await outbox.drain()
    finally:
        await outbox.stop()
        await off.aclose()
        await on.aclose()
        store.dispose()
    return results


async def cleanup(client: redis.asyncio.Redis, prefix: str) -> None:
    batch: list[str] = []
    async for key in client.scan_iter(match=f"{prefix}*", count=1000):
        batch.append(key)
        if len(batch) >= 1000:
            await client.delete(*batch)
            batch.clear()
    if batch:
        await client.delete(*batch)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    prices = load_prices(PRICES, "USD")
    client = make_client(RedisSettings(redis_url_for_tests()))
    result: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "goal": {"settle_p50_added_ms_max": GOAL_P50_ADDED_MS},
        "writes": {},
        "drain": {},
    }
    with databases(args.postgres) as urls:
        try:
            for name, url in urls.items():
                print(f"writes: {name}")
                result["writes"][name] = bench_writes(store_for(url), args.rows, args.batch)
                prefix = f"bench-us-{uuid.uuid4().hex[:8]}:"
                print(f"drain: {name}")
                try:
                    result["drain"][name] = await bench_drain(
                        client, prefix, prices, url, args.spool
                    )
                finally:
                    await cleanup(client, prefix)
            prefix = f"bench-us-{uuid.uuid4().hex[:8]}:"
            url = urls.get("postgresql", urls["sqlite"])
            print("settle path: store on vs off")
            try:
                result["settle_path"] = await bench_settle_path(client, prefix, prices, url, args)
            finally:
                await cleanup(client, prefix)
            result["settle_path"]["store_database"] = url.split(":", 1)[0]
        finally:
            await client.aclose()
    added = result["settle_path"]["concurrency_1"]["added_p50_ms"]
    result["goal"]["settle_p50_added_ms"] = added
    result["goal"]["met"] = added <= GOAL_P50_ADDED_MS
    return result


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--rows", type=int, default=20_000, help="rows for the write benchmark")
    p.add_argument("--batch", type=int, default=500, help="rows per batch (the drainer's)")
    p.add_argument("--spool", type=int, default=10_000, help="rows spooled before a drain")
    p.add_argument("--settles", type=int, default=1000, help="settles per arm and round")
    p.add_argument("--rounds", type=int, default=4, help="alternating rounds per concurrency")
    p.add_argument("--postgres", default=DEFAULT_PG, help="PostgreSQL server (no database)")
    return p.parse_args()


if __name__ == "__main__":
    outcome = asyncio.run(main(parse()))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(outcome, indent=2) + "\n")
    print(json.dumps(outcome, indent=2))
