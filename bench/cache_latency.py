"""bench_cache's latency half: a real cache server on its own Redis, Lookup p50/p99."""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch
from cache_quality import (
    EXACT_LOOKUPS,
    MODEL,
    PREFIX,
    START_TIMEOUT_S,
    TENANT,
    THRESHOLD,
    Pair,
    Vectors,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llm_cache import guard, scripts
from llm_cache.canonical import request_key
from llm_cache.config import Policy, RedisSettings, SemanticSettings
from llm_cache.encoder import Encoder
from llm_cache.index import VectorIndex
from llm_cache.server import redis_client
from llm_cache.store import NewEntry, RedisStore
from llm_common.grpc_runtime import with_grpc_runtime
from llm_common.resilience import AsyncBreaker, BreakerMetrics
from llm_testing import free_port
from llmapi.cache.v1 import cache_service_pb2 as pb
from llmapi.cache.v1 import cache_service_pb2_grpc as pb_grpc
from llmapi.common.v1 import common_pb2

# --- latency -------------------------------------------------------------------------------


def chat_key(text: str) -> pb.CacheKey:
    key = pb.CacheKey(
        tenant_id=TENANT, model=MODEL, sampling=common_pb2.SamplingParams(temperature=0.0)
    )
    key.messages.add(role=common_pb2.ROLE_USER, content=text)
    return key


def random_units(rng: np.random.Generator, n: int, dim: int) -> Vectors:
    v = rng.standard_normal((n, dim)).astype(np.float32)
    norms: Vectors = np.linalg.norm(v, axis=1, keepdims=True)
    return v / norms


def bench_store(url: str) -> tuple[RedisStore, Any]:
    """The service's store code on the bench's Redis, and its redis-py client."""
    settings = RedisSettings(url=url, key_prefix=PREFIX, timeout_s=10.0)
    client = redis_client(settings)
    breaker = AsyncBreaker("bench", fail_max=10**6, metrics=BreakerMetrics(_registry()))
    return RedisStore(client, settings, Policy(tenant_budget_bytes=1 << 32), breaker), client


async def fill(url: str, start: int, stop: int, dim: int, seed: int) -> None:
    """Filler entries start..stop-1, written with the service's store code (same Lua, same
    accounting), each with a random unit vector in the queries' namespace."""
    store, client = bench_store(url)
    rng = np.random.default_rng(seed)
    response = pb.CachedResponse(text="x" * 200, finish_reason=common_pb2.FINISH_REASON_STOP)
    body = response.SerializeToString()
    try:
        for chunk in range(start, stop, 100):  # 100 scripts in flight at a time
            ids = range(chunk, min(chunk + 100, stop))
            units = random_units(rng, len(ids), dim)
            entries = []
            for i, vector in zip(ids, units, strict=True):
                key = request_key(chat_key(f"filler entry number {i}"))
                entry = NewEntry(
                    key.entry_id, MODEL, key.namespace, body, int(time.time() * 1000),
                    86_400 * 30, vector.tobytes(), f"filler entry number {i}",
                )  # fmt: skip
                entries.append(store.put(TENANT, entry))
            await asyncio.gather(*entries)
    finally:
        await store.aclose()
        await client.aclose()


async def store_read_cost(url: str, size: int, fillers: int) -> dict[str, Any]:
    """The exact read alone, in this process: the store's path (GET_EXACT on RedisMux, under
    the breaker and its timeout) vs the same script through redis-py's pool (what the store
    used before). CPU per call is this process's time; Redis's own time is not in it.
    Reads the first filler entries (up to 200; at small sizes there are fewer)."""
    if fillers <= 0:
        return {"entries": size, "skipped": "no filler entries at this size"}
    store, client = bench_store(url)
    script = client.register_script(scripts.GET_EXACT)
    count = min(200, fillers)
    ids = [request_key(chat_key(f"filler entry number {i}")).entry_id for i in range(count)]
    repeats = max(10, 2000 // count)  # about 2,000 timed reads whatever the size
    keys, now = store.keys(TENANT), int(time.time() * 1000)

    async def redis_py(entry_id: str) -> Any:
        return await script(keys=[keys.entry(entry_id), keys.accounting[1]], args=[entry_id, now])

    async def mux(entry_id: str) -> Any:
        return await store.get_exact(TENANT, entry_id)

    out: dict[str, Any] = {"entries": size}
    try:
        for name, read in (("redis_py_pool_baseline", redis_py), ("redis_mux", mux)):
            for entry_id in ids:  # warm-up: connections, scripts
                assert await read(entry_id)
            cpu, times = time.process_time(), []
            for entry_id in ids * repeats:
                started = time.perf_counter()
                await read(entry_id)
                times.append((time.perf_counter() - started) * 1000)
            per_call_us = 1e6 * (time.process_time() - cpu) / len(times)
            out[name] = summary(times) | {"cpu_us_per_read": round(per_call_us, 1)}
    finally:
        await store.aclose()
        await client.aclose()
    return out


def _registry() -> Any:
    from prometheus_client import CollectorRegistry

    return CollectorRegistry()


@dataclass(frozen=True, slots=True)
class Server:
    stub: pb_grpc.CacheServiceStub
    health: health_pb2_grpc.HealthStub
    pid: int
    start_s: float

    def cpu_s(self) -> float:
        """CPU seconds the server process has used (Linux /proc; 0 elsewhere)."""
        try:
            fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def cache_server(url: str, threads: int, verifier: str = "off") -> Iterator[Server]:
    """`python -m llm_cache` on a free port, yielded once its index is rebuilt."""
    port = free_port()
    env = {
        **with_grpc_runtime(os.environ),
        "GRPC_PORT": str(port),
        "METRICS_PORT": "off",
        "LOG_LEVEL": "WARNING",
        "REDIS_URL": url,
        "CACHE_KEY_PREFIX": PREFIX,
        "CACHE_TENANT_BUDGET_BYTES": str(1 << 32),
        "CACHE_ENCODER_THREADS": str(threads),
        "CACHE_REDIS_TIMEOUT_S": "2",
        "HF_HUB_OFFLINE": "1",
        "CACHE_SEMANTIC_VERIFIER": verifier,
    }
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", "llm_cache"], env=env)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        health = health_pb2_grpc.HealthStub(channel)
        health.Check(health_pb2.HealthCheckRequest(), timeout=START_TIMEOUT_S, wait_for_ready=True)
        stub = pb_grpc.CacheServiceStub(channel)
        wait_for_index(stub)
        yield Server(stub, health, process.pid, time.perf_counter() - started)
    finally:
        channel.close()
        process.terminate()
        process.wait(timeout=30)


def wait_for_index(stub: pb_grpc.CacheServiceStub) -> None:
    """Until the server's start-up index rebuild has finished."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while not stub.Stats(pb.StatsRequest(tenant_id=TENANT)).index_ready:
        if time.monotonic() > deadline:
            raise RuntimeError("the index was not rebuilt in time")
        time.sleep(0.2)  # polling another process: there is no event to wait on


def timed(calls: Sequence[Callable[[], Any]]) -> tuple[list[float], list[Any]]:
    times, results = [], []
    for call in calls:
        started = time.perf_counter()
        results.append(call())
        times.append((time.perf_counter() - started) * 1000)
    return times, results


def summary(times_ms: list[float]) -> dict[str, float]:
    ordered = sorted(times_ms)
    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered), 3),
        "p99_ms": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
        "mean_ms": round(statistics.fmean(ordered), 3),
    }


def lookup_latency(
    server: Server, sources: list[str], queries: dict[str, list[str]], size: int
) -> dict[str, Any]:
    """Exact hits (sources and fillers), then semantic lookups per query set."""
    stub = server.stub
    rng = random.Random(size)
    exact_keys = [chat_key(t) for t in rng.choices(sources, k=EXACT_LOOKUPS // 2)]
    exact_keys += [chat_key(f"filler entry number {rng.randrange(size - 999)}")
                   for _ in range(EXACT_LOOKUPS // 2)]  # fmt: skip
    rng.shuffle(exact_keys)
    for key in exact_keys[:100]:  # warm-up: connections, scripts, code paths
        stub.Lookup(pb.LookupRequest(key=key))
    cpu = server.cpu_s()
    exact_times, exact = timed(
        [lambda k=k: stub.Lookup(pb.LookupRequest(key=k)) for k in exact_keys]  # type: ignore[misc]
    )
    # Baseline in the same run: the cheapest RPC of the same server (health check: same
    # gRPC stack and interceptors, no Redis, no cache code).
    check = health_pb2.HealthCheckRequest()
    floor_times, _ = timed([lambda: server.health.Check(check)] * len(exact_keys))
    row: dict[str, Any] = {
        "entries": size,
        "load_average": os.getloadavg()[0],
        "exact_hit": summary(exact_times),
        "grpc_floor_health_check": summary(floor_times),
        "exact_hits_served": sum(r.kind == pb.HIT_KIND_EXACT for r in exact) / len(exact),
        "server_cpu_ms_per_lookup": {"exact": round(1000 * (server.cpu_s() - cpu) / len(exact), 3)},
    }
    options = pb.LookupOptions(semantic=True)
    for name, texts in queries.items():
        cpu = server.cpu_s()
        times, served = timed(
            [lambda q=q: stub.Lookup(pb.LookupRequest(key=chat_key(q), options=options))  # type: ignore[misc]
             for q in texts]
        )  # fmt: skip
        cpu_ms = 1000 * (server.cpu_s() - cpu) / len(texts)
        row[name] = summary(times) | {
            "hit_rate": sum(r.kind == pb.HIT_KIND_SEMANTIC for r in served) / len(served),
        }
        row["server_cpu_ms_per_lookup"][name] = round(cpu_ms, 3)
    return row


def service_precision(
    stub: pb_grpc.CacheServiceStub, pairs: list[Pair], entry_of: dict[str, str]
) -> dict[str, float]:
    """GPTCache's protocol through the running service: hit rate and precision of what the
    Lookup RPC serves for every paraphrase (all sources and the fillers stored)."""
    options = pb.LookupOptions(semantic=True)
    hits = correct = 0
    for p in pairs:
        found = stub.Lookup(pb.LookupRequest(key=chat_key(p.b), options=options))
        if found.kind == pb.HIT_KIND_SEMANTIC:
            hits += 1
            correct += int(found.entry_id == entry_of[p.a])
    return {"hit_rate": hits / len(pairs), "precision": correct / hits if hits else 0.0}


def search_latency(dim: int, size: int, threads: int, encoder: Encoder) -> dict[str, Any]:
    """In-process breakdown: encoding one query, and searching `size` rows with the
    prefilter (the service) vs a full exact scan (the baseline)."""
    torch.set_num_threads(threads)
    rng = np.random.default_rng(size)
    rows = random_units(rng, size, dim)
    feats = guard.extract("")
    prefiltered, full = (
        VectorIndex(dim, max_vectors=size, prefilter_min_rows=m, prefilter_keep=256)
        for m in (SemanticSettings().prefilter_min_rows, 10**9)
    )
    for i, row in enumerate(rows):
        prefiltered.put("ns", str(i), row, feats)
        full.put("ns", str(i), row, feats)
    queries = random_units(rng, 300, dim)
    out: dict[str, Any] = {}
    for name, index in (("prefilter", prefiltered), ("full_scan_baseline", full)):
        times, _ = timed([lambda q=q, i=index: i.search("ns", q, 8, THRESHOLD) for q in queries])  # type: ignore[misc]
        out[f"search_{name}"] = summary(times)
    texts = [f"How do I configure service number {i} for production use?" for i in range(200)]
    baseline = Encoder(encoder.model_dir, dtype=torch.float32)
    for name, model in (("encode_one_query", encoder), ("encode_one_query_float32", baseline)):
        times, _ = timed([lambda t=t, m=model: m.encode([t]) for t in texts])  # type: ignore[misc]
        out[name] = summary(times)
    out["encoder_dtype"] = str(encoder.dtype).removeprefix("torch.")
    return out


def store_sources(stub: pb_grpc.CacheServiceStub, sources: list[str]) -> dict[str, str]:
    response = pb.CachedResponse(text="cached", finish_reason=common_pb2.FINISH_REASON_STOP)
    ids = {}
    for text in sources:
        result = stub.Store(pb.StoreRequest(key=chat_key(text), response=response))
        ids[text] = result.entry_id
    return ids


def query_sets(paraphrases: list[Pair], qqp: list[Pair], parts: int) -> list[dict[str, list[str]]]:
    """Per phase, unseen texts (the encoder's recent-embedding cache must not help):
    paraphrases of stored sources (semantic hits; documentation sentences) and QQP questions
    (short user questions; nothing similar stored, so mostly misses after the full search)."""
    para = [p.b for p in paraphrases]
    questions = [p.b for p in qqp if not p.duplicate][: 500 * parts]
    return [
        {"semantic_paraphrase": para[k::parts], "semantic_question": questions[k::parts]}
        for k in range(parts)
    ]


def verified_lookups(
    url: str, threads: int, paraphrases: list[Pair], queries: dict[str, list[str]], size: int
) -> dict[str, Any]:
    """Semantic Lookup latency and GPTCache's protocol (odd lines: the verifier trained on
    lines 0 mod 4) through a server whose tenants use the learned verifier (balanced), on
    the same entries as the default server."""
    sources = [p.a for p in paraphrases]
    with cache_server(url, threads, verifier="balanced") as server:
        entry_of = store_sources(server.stub, sources)
        row = lookup_latency(server, sources, queries, size)
        precision = service_precision(server.stub, paraphrases[1::2], entry_of)
    kinds = ("semantic_paraphrase", "semantic_question")
    return {k: row[k] for k in kinds} | {"gptcache_protocol_end_to_end_odd_lines": precision}


def latency(
    url: str,
    sizes: list[int],
    paraphrases: list[Pair],
    qqp: list[Pair],
    encoder: Encoder,
    threads: int,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    sources = [p.a for p in paraphrases]
    phases = query_sets(paraphrases, qqp, len(sizes))
    results, filled = [], 0
    precision: dict[str, Any] = {}
    for n, (size, queries) in enumerate(zip(sizes, phases, strict=True)):
        started = time.perf_counter()
        asyncio.run(fill(url, filled, size - len(sources), encoder.dim, seed=n))
        fill_s = time.perf_counter() - started
        filled = size - len(sources)
        with cache_server(url, threads) as server:
            stub = server.stub
            entry_of = store_sources(stub, sources)
            row = lookup_latency(server, sources, queries, size)
            row["query_tokens_mean"] = {
                name: round(statistics.fmean(encoder.token_counts(texts)), 1)
                for name, texts in queries.items()
            }
            stats = stub.Stats(pb.StatsRequest(tenant_id=TENANT))
            row |= {
                "fill_s": round(fill_s, 1),
                "server_start_and_index_rebuild_s": round(server.start_s, 1),
                "stored_entries": stats.entries,
                "stored_bytes": stats.bytes,
                "indexed_vectors": stats.indexed_vectors,
            }
            if n == len(sizes) - 1:
                precision = {
                    **service_precision(stub, paraphrases, entry_of),
                    "odd_lines": service_precision(stub, paraphrases[1::2], entry_of),
                }
        if n == len(sizes) - 1:  # the same lookups with the verifier (balanced), same run
            row["verifier_balanced"] = verified_lookups(url, threads, paraphrases, queries, size)
        row |= search_latency(encoder.dim, size, threads, encoder)
        row["store_read"] = asyncio.run(store_read_cost(url, size, filled))
        results.append(row)
        print(f"  {size} entries: exact p50 {row['exact_hit']['p50_ms']} ms, semantic p50 "
              f"{row['semantic_paraphrase']['p50_ms']} / {row['semantic_question']['p50_ms']} ms "
              f"(paraphrases / questions)", flush=True)  # fmt: skip
    return results, precision
