"""Auth benchmark: ext_authz latency through a real Envoy vs the same upstream route without
ext_authz (one run, interleaved), and rate-limit decisions per second -> bench/results/auth.json.

Run from the repository root: `.venv/bin/python bench/bench_auth.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2
from envoy.service.ratelimit.v3 import rls_pb2_grpc as rls_grpc

from llm_auth.apikeys import parse_key
from llm_auth.authenticator import now_ms
from llm_auth.config import RedisSettings
from llm_auth.keyspace import Keyspace
from llm_auth.keystore import KeyStore, NewKey
from llm_auth.limiter import BucketSpec, Limiter
from llm_auth.principal import KeyLimits
from llm_auth.redis_guard import RedisGuard, connect
from llm_auth.testing import (
    JwtSigner,
    delete_prefix,
    echo_upstream,
    envoy_binary,
    http_request,
    render,
    running_envoy,
    standard_claims,
    with_http_authz,
)
from llm_testing import free_port, redis_url_for_tests

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "services" / "auth" / "tests" / "integration" / "envoy.yaml.tmpl"
RESULTS = ROOT / "bench" / "results"
PEPPER = "bench-pepper-" + uuid.uuid4().hex
ISSUER, AUDIENCE = "https://issuer.bench", "llm-api"
AUTHZ = "envoy.service.auth.v3.Authorization"
RLS = "envoy.service.ratelimit.v3.RateLimitService"
GOAL_ADDED_P50_MS = 1.0
BLOCK = 50  # routes alternate in blocks, so drift in machine load hits all of them alike


@dataclass(frozen=True)
class Route:
    name: str
    method: str
    metadata: tuple[tuple[str, str], ...]
    # Which Envoy: ext_authz on auth's HTTP listener (as `make up` runs it), Check on its gRPC
    # edge listener, or Check on its main port.
    envoy: str = "http"
    baseline: str = "no_ext_authz"  # the route without ext_authz on the same Envoy


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summary(samples_ms: list[float]) -> dict[str, float]:
    return {
        "n": len(samples_ms),
        "p50_ms": round(percentile(samples_ms, 50), 4),
        "p90_ms": round(percentile(samples_ms, 90), 4),
        "p99_ms": round(percentile(samples_ms, 99), 4),
        "mean_ms": round(statistics.fmean(samples_ms), 4),
    }


def start_process(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(args, env=env)


@dataclass(frozen=True)
class AuthProcess:
    port: int
    edge_port: int
    http_port: int
    metrics_port: int

    async def handler_ms(self, service: str, method: str) -> dict[str, float]:
        """Mean time inside the service per RPC (from its llm_rpc_duration_seconds)."""
        _, _, body = await http_request("127.0.0.1", self.metrics_port, "GET", "/metrics")
        labels = f'method="{method}",service="{service}"'
        values = {}
        for line in body.decode().splitlines():
            for stat in ("sum", "count"):
                if line.startswith(f"llm_rpc_duration_seconds_{stat}{{{labels}}}"):
                    values[stat] = float(line.rsplit(" ", 1)[1])
        return {"rpcs": values["count"], "mean_ms": round(values["sum"] / values["count"] * 1e3, 4)}


@contextlib.asynccontextmanager
async def auth_process(redis_url: str, prefix: str, jwks: Path) -> AsyncIterator[AuthProcess]:
    """The auth service as its own process (as deployed), on a free port."""
    port, edge_port, http_port, metrics_port = free_port(), free_port(), free_port(), free_port()
    env = {
        **os.environ,
        "GRPC_PORT": str(port),
        "AUTH_EDGE_PORT": str(edge_port),
        "AUTH_HTTP_AUTHZ_PORT": str(http_port),
        "METRICS_PORT": str(metrics_port),
        "LOG_LEVEL": "WARNING",
        "REDIS_URL": redis_url,
        "AUTH_REDIS_PREFIX": prefix,
        "AUTH_PEPPER": PEPPER,
        "AUTH_JWKS_FILE": str(jwks),
        "AUTH_JWT_ISSUER": ISSUER,
        "AUTH_JWT_AUDIENCE": AUDIENCE,
    }
    process = start_process([sys.executable, "-m", "llm_auth"], env)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            await asyncio.wait_for(channel.channel_ready(), 60)
        yield AuthProcess(port, edge_port, http_port, metrics_port)
    finally:
        process.terminate()
        process.wait(timeout=30)


async def create_key(redis_url: str, prefix: str, limits: KeyLimits) -> str:
    settings = RedisSettings(url=redis_url, prefix=prefix)
    client = connect(settings)
    try:
        store = KeyStore(RedisGuard(client, settings), Keyspace(prefix), PEPPER.encode())
        spec = NewKey(tenant_id="bench", scopes=("completion:write",), limits=limits)
        _, key = await store.create(spec, now_ms())
        return key.text
    finally:
        await client.aclose()


async def measure_routes(
    channels: dict[str, grpc.aio.Channel], routes: list[Route], requests: int, warmup: int
) -> dict[str, list[float]]:
    """Sequential unary calls (one in flight), routes interleaved in blocks."""
    calls: dict[str, grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]] = {
        r.name: channels[r.envoy].unary_unary(r.method) for r in routes
    }
    samples: dict[str, list[float]] = {r.name: [] for r in routes}
    for route in routes:
        for _ in range(warmup):
            await calls[route.name](b"{}", metadata=route.metadata, timeout=5)
    for _ in range(0, requests, BLOCK):
        for route in routes:
            call = calls[route.name]
            for _ in range(BLOCK):
                start = time.perf_counter()
                await call(b"{}", metadata=route.metadata, timeout=5)
                samples[route.name].append((time.perf_counter() - start) * 1e3)
    return samples


async def rate(
    fn: Callable[[], Awaitable[Any]], concurrency: int, seconds: float
) -> dict[str, float]:
    """Calls per second with `concurrency` loops calling `fn` for `seconds`."""
    count = 0
    deadline = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal count
        while time.perf_counter() < deadline:
            await fn()
            count += 1

    start = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    return {"decisions": count, "seconds": round(elapsed, 3), "per_second": round(count / elapsed)}


async def rls_rate(port: int, key_id: str, seconds: float, concurrency: int) -> dict[str, float]:
    """ShouldRateLimit over gRPC against the auth process (a per-key bucket that never fills)."""
    descriptor = ratelimit_pb2.RateLimitDescriptor()
    descriptor.entries.add(key="tenant", value="bench")
    descriptor.entries.add(key="key_id", value=key_id)
    request = rls_pb2.RateLimitRequest(domain="llm-api", descriptors=[descriptor])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = rls_grpc.RateLimitServiceStub(channel)

        async def decide() -> None:
            reply = await stub.ShouldRateLimit(request, timeout=5)
            assert reply.overall_code == rls_pb2.RateLimitResponse.OK

        await rate(decide, concurrency, 0.3)  # warm-up
        return await rate(decide, concurrency, seconds)


async def limiter_rate(redis_url: str, prefix: str, seconds: float) -> dict[str, float]:
    """The Lua token bucket alone, in this process (no gRPC): the Redis-side ceiling."""
    settings = RedisSettings(url=redis_url, prefix=prefix)
    client = connect(settings)
    try:
        limiter = Limiter(RedisGuard(client, settings), Keyspace(prefix))
        bucket = BucketSpec("req:key:bench", limit=10**9)

        async def hit() -> None:
            await limiter.hit("bench", [bucket], 1)

        try:
            return await rate(hit, 16, seconds)
        finally:
            await limiter.aclose()
    finally:
        await client.aclose()


def plot(samples: dict[str, list[float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, values in samples.items():
        ordered = sorted(values)
        ax.plot(ordered, [i / len(ordered) for i in range(len(ordered))], label=name)
    ax.set_xlabel("latency through Envoy (ms)")
    ax.set_ylabel("fraction of requests")
    ax.set_xlim(0, percentile([v for vs in samples.values() for v in vs], 99.5))
    ax.set_title("ext_authz cost per request (sequential unary gRPC calls)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


async def run(args: argparse.Namespace, signer: JwtSigner, workdir: Path) -> dict[str, Any]:
    redis_url = redis_url_for_tests()
    prefix = f"bench:auth:{uuid.uuid4().hex[:12]}:"
    jwks = workdir / "jwks.json"
    try:
        key = await create_key(redis_url, prefix, KeyLimits())
        limited = await create_key(redis_url, prefix, KeyLimits(requests_per_minute=10**9))
        token = signer.token("RS256", standard_claims(ISSUER, AUDIENCE, "bench", ttl_s=3600))
        bearer = f"Bearer {token}"
        main_base, api_key = "main_port.no_ext_authz", (("x-api-key", key),)
        edge_base, jwt = "grpc_edge.no_ext_authz", (("authorization", bearer),)
        routes = [
            Route("no_ext_authz", "/echo.Open/Headers", ()),
            Route("ext_authz_api_key", "/echo.Echo/Headers", api_key),
            Route("ext_authz_jwt_rs256", "/echo.Echo/Headers", jwt),
            Route("ext_authz_api_key_and_rls", "/echo.Limited/Headers", (("x-api-key", limited),)),
            Route(edge_base, "/echo.Open/Headers", (), "edge", edge_base),
            Route("grpc_edge.ext_authz_api_key", "/echo.Echo/Headers", api_key, "edge", edge_base),
            Route("grpc_edge.ext_authz_jwt_rs256", "/echo.Echo/Headers", jwt, "edge", edge_base),
            Route(main_base, "/echo.Open/Headers", (), "main", main_base),
            Route("main_port.ext_authz_api_key", "/echo.Echo/Headers", api_key, "main", main_base),
        ]  # fmt: skip
        async with (
            auth_process(redis_url, prefix, jwks) as auth,
            echo_upstream() as upstream_port,
            contextlib.AsyncExitStack() as stack,
        ):
            channels = {}
            for name, auth_port in (("http", auth.edge_port), ("edge", auth.edge_port),
                                    ("main", auth.port)):  # fmt: skip
                port = free_port()
                config = render(
                    TEMPLATE, listener_port=port, upstream_port=upstream_port, auth_port=auth_port
                )
                if name == "http":  # ext_authz over HTTP; rate limits stay on the edge listener
                    config = with_http_authz(config, auth.http_port)
                await stack.enter_async_context(running_envoy(config, workdir / f"envoy-{name}"))
                channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
                channels[name] = await stack.enter_async_context(channel)
            load_before = os.getloadavg()[0]
            samples = await measure_routes(channels, routes, args.requests, args.warmup)
            load_after = os.getloadavg()[0]
            handler = {
                "ext_authz_check": await auth.handler_ms(AUTHZ, "Check"),
                "should_rate_limit": await auth.handler_ms(RLS, "ShouldRateLimit"),
            }
            rls = await rls_rate(auth.edge_port, parse_key(limited).key_id, args.seconds, 32)
        lua = await limiter_rate(redis_url, prefix, args.seconds)
    finally:
        await delete_prefix(redis_url, prefix)
    load = {"load_average_1m_before": load_before, "load_average_1m_after": load_after}
    return report(samples, routes, handler, rls, lua, load, args, RESULTS / "auth_latency.png")


def report(
    samples: dict[str, list[float]],
    routes: list[Route],
    handler: dict[str, dict[str, float]],
    rls: dict[str, float],
    lua: dict[str, float],
    load: dict[str, float],
    args: argparse.Namespace,
    png: Path,
) -> dict[str, Any]:
    stats = {name: summary(values) for name, values in samples.items()}
    added = {
        r.name: {
            "p50_ms": round(stats[r.name]["p50_ms"] - stats[r.baseline]["p50_ms"], 4),
            "p99_ms": round(stats[r.name]["p99_ms"] - stats[r.baseline]["p99_ms"], 4),
        }
        for r in routes
        if r.name != r.baseline
    }
    plot(samples, png)
    return {
        "benchmark": "auth",
        "what": "unary gRPC through Envoy to an echo upstream, one request in flight; "
        f"routes interleaved in blocks of {BLOCK}; baseline = same upstream and Envoy, "
        "ext_authz off. Three Envoys: the default one asks auth's HTTP ext_authz listener "
        "(AUTH_HTTP_AUTHZ_PORT, as `make up` runs it) and its gRPC edge listener for rate "
        "limits; grpc_edge.* sends Check over gRPC to the edge listener (AUTH_EDGE_PORT, no "
        "interceptors); main_port.* sends Check to auth's main gRPC port with its interceptors. "
        "ShouldRateLimit decisions/s are measured on the edge listener",
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            # Shared machines: the load says how much the figures may be inflated.
            **{k: round(v, 2) for k, v in load.items()},
            "load_average_1m_at_end": round(os.getloadavg()[0], 2),
        },
        "envoy": str(envoy_binary()),
        "requests_per_route": args.requests,
        "latency": stats,
        "added_by_ext_authz": added,
        # Time inside the auth service's handler (both listeners), without gRPC transport.
        "auth_service_time_per_rpc": handler,
        "goal": {
            "added_p50_ms_at_most": GOAL_ADDED_P50_MS,
            "judged_on": "ext_authz_api_key (HTTP ext_authz, the deployed configuration)",
            "met": added["ext_authz_api_key"]["p50_ms"] <= GOAL_ADDED_P50_MS,
            "met_by_jwt_rs256": added["ext_authz_jwt_rs256"]["p50_ms"] <= GOAL_ADDED_P50_MS,
            "met_by_grpc_check": added["grpc_edge.ext_authz_api_key"]["p50_ms"]
            <= GOAL_ADDED_P50_MS,
        },
        "rate_limit_decisions": {"grpc_should_rate_limit": rls, "lua_bucket_in_process": lua},
        "plot": str(png.relative_to(ROOT)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000, help="measured calls per route")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured calls per route")
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each rate run")
    parser.add_argument("--out", type=Path, default=RESULTS / "auth.json")
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    signer = JwtSigner.generate()
    with tempfile.TemporaryDirectory(prefix="bench-auth-") as tmp:
        workdir = Path(tmp)
        (workdir / "jwks.json").write_text(json.dumps(signer.jwks()), encoding="utf-8")
        result = asyncio.run(run(args, signer, workdir))
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    keys = ["machine", "latency", "added_by_ext_authz", "auth_service_time_per_rpc", "goal"]
    keys.append("rate_limit_decisions")
    brief = {k: result[k] for k in keys}
    print(json.dumps(brief, indent=2))


if __name__ == "__main__":
    main()
