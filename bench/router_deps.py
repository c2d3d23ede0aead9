"""bench_router's helper processes: tokenizer, auth, billing and cache, one process each."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router_config import ENTRY, PRICES, ROOT, SCOPES
from router_procs import Proc

from llm_common.grpc_runtime import with_grpc_runtime
from llm_testing import free_port, redis_url_for_tests

DEP_SERVICES = ("tokenizer", "auth", "billing", "cache")


@dataclass(frozen=True)
class DepSpec:
    """What one dependency's process serves: its server settings, service spec and app."""

    server: Any  # llm_common.config.ServerSettings (imported in the helper process only)
    spec: Any
    app: Any = None  # auth's AuthApp: it also creates the benchmark's API key


def dep_spec(name: str, config: dict[str, Any]) -> DepSpec:
    """One dependency, as its own process runs it."""
    from llm_common.config import ServerSettings

    server = ServerSettings(service_name=name, grpc_port=config[name], metrics_port=None)
    builders = {
        "tokenizer": _tokenizer_spec,
        "billing": _billing_spec,
        "auth": _auth_spec,
        "cache": _cache_spec,
    }
    return builders[name](server, config)


def _tokenizer_spec(server: Any, config: dict[str, Any]) -> DepSpec:
    from llm_common.models_config import load_catalog
    from llm_common.tokenization.registry import load_registry
    from llm_tokenizer.config import Limits
    from llm_tokenizer.server import build_spec as tokenizer_spec

    catalog = load_catalog(Path(config["models"]), Path(config["work"]))
    return DepSpec(server, tokenizer_spec(load_registry(catalog), Limits()))


def _billing_spec(server: Any, config: dict[str, Any]) -> DepSpec:
    from prometheus_client import CollectorRegistry

    from llm_billing.config import LedgerSettings, RedisSettings
    from llm_billing.config import Settings as BillingSettings
    from llm_billing.metrics import BillingMetrics
    from llm_billing.prices import load_prices
    from llm_billing.server import build_billing
    from llm_billing.server import build_spec as billing_spec

    billing = build_billing(
        BillingSettings(
            server=server,
            redis=RedisSettings(config["redis"]),
            prices_config=PRICES,
            ledger=LedgerSettings(key_prefix=f"{config['prefix']}billing:"),
        ),
        load_prices(PRICES, "USD"),
        metrics=BillingMetrics(CollectorRegistry()),
    )
    return DepSpec(server, billing_spec(billing))


def _auth_spec(server: Any, config: dict[str, Any]) -> DepSpec:
    from prometheus_client import CollectorRegistry

    from llm_auth.config import RedisSettings as AuthRedis
    from llm_auth.config import Settings as AuthSettings
    from llm_auth.metrics import AuthMetrics
    from llm_auth.server import AuthApp
    from llm_auth.testing import TEST_PEPPER

    auth_settings = AuthSettings(
        server=server,
        pepper=TEST_PEPPER,
        redis=AuthRedis(url=config["redis"], prefix=f"{config['prefix']}auth:"),
    )
    app = AuthApp(auth_settings, metrics=AuthMetrics(CollectorRegistry()))
    return DepSpec(server, app.spec(), app)


def _cache_spec(server: Any, config: dict[str, Any]) -> DepSpec:
    from prometheus_client import CollectorRegistry

    from llm_cache.config import RedisSettings as CacheRedis
    from llm_cache.config import SemanticSettings
    from llm_cache.config import Settings as CacheSettings
    from llm_cache.metrics import CacheMetrics
    from llm_cache.server import CacheApp
    from llm_cache.server import build_spec as cache_spec

    # Exact-match cache only: the semantic encoder would compete for the 2 cores.
    cache_settings = CacheSettings(
        server=server,
        redis=CacheRedis(url=config["redis"], key_prefix=f"{config['prefix']}cache:"),
        semantic=SemanticSettings(enabled=False),
    )
    cache = CacheApp(cache_settings, None, metrics=CacheMetrics(CollectorRegistry()))
    return DepSpec(server, cache_spec(cache))


async def serve_dep(name: str, config: dict[str, Any]) -> None:
    """Serve one dependency until SIGTERM; auth also creates the benchmark's API key."""
    from llm_common.logging import configure_logging
    from llm_common.server import running as running_server

    # Logs go to stderr (a file): stdout is a pipe the parent reads only one line from.
    configure_logging(f"bench-{name}", os.environ.get("LOG_LEVEL", "WARNING"), stream=sys.stderr)
    dep = dep_spec(name, config)
    async with running_server(dep.server, dep.spec):
        ready: dict[str, Any] = {"ready": name}
        if name == "auth":
            from llm_auth.principal import KeyLimits
            from llm_auth.testing import AuthHarness

            harness = AuthHarness(dep.app, config["auth"], None)  # type: ignore[arg-type]
            record, _ = await harness.create_key(
                config["tenant"],
                scopes=tuple(SCOPES.split(",")),
                limits=KeyLimits(tokens_per_minute=10**9),
            )
            ready["key_id"] = record.key_id
        print(json.dumps(ready), flush=True)
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
    if name == "auth":
        await forget_keys(config)


async def forget_keys(config: dict[str, Any]) -> None:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(config["redis"])
    keys = [k async for k in client.scan_iter(match=f"{config['prefix']}*", count=500)]
    if keys:
        await client.delete(*keys)
    await client.aclose()


def start_deps(logdir: Path, work: Path) -> tuple[list[Proc], dict[str, Any]]:
    """Start the four dependencies, each in its own process as deployed; wait until they serve."""
    config: dict[str, Any] = {
        **{name: free_port() for name in DEP_SERVICES},
        "redis": redis_url_for_tests(),
        "prefix": f"bench:router:{uuid.uuid4().hex[:8]}:",
        "tenant": f"bench{uuid.uuid4().hex[:8]}",
        "models": str(work / "models.yaml"),
        "work": str(work),
    }
    level = os.environ.get("BENCH_LOG_LEVEL", "WARNING")
    procs: list[Proc] = []
    for name in DEP_SERVICES:
        args = [sys.executable, str(ENTRY), "--deps", json.dumps(config), "--dep", name]
        process = subprocess.Popen(
            args,
            env=with_grpc_runtime(os.environ) | {"LOG_LEVEL": level, "OMP_NUM_THREADS": "1"},
            stdout=subprocess.PIPE,
            stderr=(logdir / f"{name}.log").open("wb"),
            cwd=ROOT,
        )
        procs.append(Proc(name, process, int(config[name])))
    key = ""
    for proc in procs:
        assert proc.process.stdout is not None
        line = proc.process.stdout.readline().decode()
        if not line:
            log = (logdir / f"{proc.name}.log").read_text()[-3000:]
            raise RuntimeError(f"{proc.name} failed: {log}")
        key = json.loads(line).get("key_id", key)
    deps = {
        **{name: f"127.0.0.1:{config[name]}" for name in DEP_SERVICES},
        "metadata": (("x-tenant-id", config["tenant"]), ("x-key-id", key), ("x-scopes", SCOPES)),
    }
    return procs, deps
