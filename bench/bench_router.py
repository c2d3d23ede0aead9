"""Router benchmark: what the full router path adds over calling inference directly, and how
much prefix-affinity routing improves TTFT over round-robin on a shared-prefix workload.

Everything runs as real processes on loopback: the tokenizer, auth, billing and cache services
(one process each, as deployed, on the real Redis), inference replicas (`python -m
llm_inference`, real engine on the demo checkpoint) and the router (`python -m llm_router`).
No Envoy.

1. Overhead, concurrency 1: the same chat requests (greedy, 4 tokens) through the router's Chat
   (tokenize, token quota, budget reserve, route, generate, guard, settle) and directly to the
   replica's Generate with the pre-tokenized prompt, taking turns; prefix caching off.
   `overhead` (the goal's verdict): the router as configured by default (ROUTER_TOKENIZE=
   speculate, its files attested by the tokenizer service, so prompts are counted in-process;
   token-quota leases) and the replica alone, nothing else running. `variants`: then the same
   router and five variants, all taking turns with the replica in one loop (each router's
   process is idle while the others are served, which costs each of them): speculation
   confirmed by the service on every request (attestation off, the default before it);
   admission before the cache lookup and generation instead of alongside them; waiting for
   the tokenizer service before anything starts (ROUTER_TOKENIZE=service, the default before
   speculation); tokenization in-process only (ROUTER_TOKENIZE=auto); and one message per
   token from the replica (ROUTER_*TOKENS_PER_MESSAGE=1, the default before token grouping;
   the direct path always gets one per token). Beside them, the
   router's call pattern with no logic at all (grpc_skeleton.py): grpc-python's own floor.
2. Shared prefixes on 2 replicas: 8 long system prompts, each asked 6 questions in shuffled
   order by 2 concurrent clients; KV memory per replica holds about half the prefixes. Mean
   time to first token with the router's expected-wait + prefix-affinity selection vs its
   round-robin baseline (replicas restarted cold for each).

Writes bench/results/router.json and router.png.
Usage: python bench/bench_router.py [--model-root .cache/models] [--requests 200]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import grpc
import grpc_skeleton
import machine
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llm_common.grpc_runtime import with_grpc_runtime
from llm_testing import free_port, redis_url_for_tests
from llmapi.common.v1 import common_pb2
from llmapi.inference.v1 import inference_service_pb2 as inf_pb
from llmapi.inference.v1 import inference_service_pb2_grpc as inf_grpc
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc
from llmapi.tokenizer.v1 import tokenizer_service_pb2 as tok_pb
from llmapi.tokenizer.v1 import tokenizer_service_pb2_grpc as tok_grpc

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PRICES = ROOT / "infra" / "config" / "prices.yaml"
MODEL = "demo-llama"
MIB = 1 << 20
START_TIMEOUT_S = 120.0
GOAL_ADDED_P50_MS = 3.0
GOAL_TTFT_SPEEDUP = 1.5
OVERHEAD_MAX_TOKENS = 4
PREFIXES, ASKS_PER_PREFIX, CONCURRENCY = 8, 6, 2
PREFIX_WORDS = 240  # about 600 prompt tokens with the demo tokenizer
AFFINITY_KV_MIB = 12  # about 3,000 tokens: half the prefixes fit on one replica
SCOPES = "completion:write,embedding:read"
WORDS = [
    "river",
    "mountain",
    "quiet",
    "engine",
    "harbor",
    "signal",
    "lantern",
    "copper",
    "meadow",
    "orbit",
    "canyon",
    "velvet",
    "ember",
    "glacier",
    "thunder",
    "willow",
    "compass",
    "falcon",
    "marble",
    "prairie",
    "summit",
    "tunnel",
    "beacon",
    "orchard",
]


@dataclass(frozen=True, slots=True)
class Stats:
    """Latency summary in milliseconds."""

    n: int
    mean: float
    p50: float
    p99: float

    @classmethod
    def of(cls, samples_s: Sequence[float]) -> Stats:
        ms = sorted(s * 1e3 for s in samples_s)
        return cls(len(ms), statistics.fmean(ms), _pct(ms, 0.50), _pct(ms, 0.99))


def _pct(sorted_ms: Sequence[float], q: float) -> float:
    index = min(len(sorted_ms) - 1, max(0, round(q * (len(sorted_ms) - 1))))
    return round(sorted_ms[index], 3)


# --- processes ---------------------------------------------------------------------------


@dataclass
class Proc:
    name: str
    process: subprocess.Popen[bytes]
    port: int
    metrics_port: int | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


def _spawn(name: str, args: list[str], env: dict[str, str], logdir: Path, port: int) -> Proc:
    log = (logdir / f"{name}.log").open("wb")
    full_env = with_grpc_runtime(os.environ) | {"PYTHONUNBUFFERED": "1", "METRICS_PORT": "off"}
    full_env |= env
    process = subprocess.Popen(args, env=full_env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    return Proc(name, process, port)


def _stop(proc: Proc) -> None:
    code = proc.process.poll()
    if code is not None and code != 0:
        print(f"{proc.name} had exited with {code}", file=sys.stderr)
    if code is None:
        proc.process.send_signal(signal.SIGTERM)
        try:
            proc.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.process.kill()
            proc.process.wait()


async def _wait_serving(proc: Proc, logdir: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    async with grpc.aio.insecure_channel(proc.target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc.process.poll() is not None:
                tail = (logdir / f"{proc.name}.log").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{proc.name} exited with {proc.process.returncode}:\n{tail}")
            with contextlib.suppress(grpc.aio.AioRpcError):
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{proc.name} did not become SERVING in time")


@contextlib.asynccontextmanager
async def running(procs: list[Proc], logdir: Path) -> AsyncIterator[list[Proc]]:
    try:
        await asyncio.gather(*(_wait_serving(p, logdir) for p in procs))
        yield procs
    finally:
        for proc in procs:
            _stop(proc)


def _inference(logdir: Path, work: Path, name: str, *, prefix_caching: bool, kv_mib: int) -> Proc:
    port = free_port()
    env = {
        "GRPC_PORT": str(port),
        "INFERENCE_MODEL": MODEL,
        "MODELS_CONFIG": str(work / "models.yaml"),
        "MODEL_ROOT": str(work),
        "INFERENCE_DEVICE": "cpu",
        "INFERENCE_KV_CACHE_BYTES": str(kv_mib * MIB),
        "INFERENCE_MAX_NUM_SEQS": "8",
        "INFERENCE_PREFIX_CACHING": "true" if prefix_caching else "false",
        "REPLICA_ID": name,
        "OMP_NUM_THREADS": "1",
        "LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "WARNING"),
    }
    return _spawn(name, [sys.executable, "-m", "llm_inference"], env, logdir, port)


def _router(
    logdir: Path,
    work: Path,
    name: str,
    deps: dict[str, Any],
    replicas: Sequence[str],
    balancer: str,
    **extra_env: str,
) -> Proc:
    port, metrics_port = free_port(), free_port()
    models = work / f"{name}-models.yaml"
    _write_models(models, work / "demo-llama", replicas)
    env = {
        "GRPC_PORT": str(port),
        "MODELS_CONFIG": str(models),
        "MODEL_ROOT": str(work),
        "ROUTER_POLICIES": str(_write_policies(work)),
        "TOKENIZER_SERVICE_ADDR": deps["tokenizer"],
        "AUTH_SERVICE_ADDR": deps["auth"],
        "BILLING_SERVICE_ADDR": deps["billing"],
        "CACHE_SERVICE_ADDR": deps.get("cache") or "off",
        "ROUTER_OUTBOX_DIR": str(work / f"{name}-outbox"),
        "ROUTER_BALANCER": balancer,
        "ROUTER_LOAD_INTERVAL_MS": "100",
        "OMP_NUM_THREADS": "1",
        "METRICS_PORT": str(metrics_port),
        **extra_env,
    }
    proc = _spawn(name, [sys.executable, "-m", "llm_router"], env, logdir, port)
    proc.metrics_port = metrics_port
    return proc


def _metrics_text(metrics_port: int) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as reply:
        text: str = reply.read().decode()
    return text


async def _attested(router: Proc) -> None:
    """Wait until the tokenizer service attests the router's files (its first poll)."""
    assert router.metrics_port is not None
    wanted = f'llm_router_tokenizer_attested{{model="{MODEL}"}} 1.0'
    deadline = time.monotonic() + START_TIMEOUT_S
    while wanted not in _metrics_text(router.metrics_port):
        if time.monotonic() > deadline:
            raise RuntimeError("the tokenizer service never attested the router's files")
        await asyncio.sleep(0.1)


def phase_means_ms(metrics_port: int) -> dict[str, float]:
    """Mean time per router phase, from its Prometheus endpoint."""
    text = _metrics_text(metrics_port)
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("llm_router_phase_seconds_sum") or line.startswith(
            "llm_router_phase_seconds_count"
        ):
            name, value = line.rsplit(" ", 1)
            phase = name.split('phase="', 1)[1].split('"', 1)[0]
            (sums if "_sum" in name else counts)[phase] = float(value)
    return {p: round(sums[p] / counts[p] * 1e3, 3) for p in sums if counts.get(p)}


def _write_models(path: Path, checkpoint: Path, replicas: Sequence[str]) -> None:
    listed = ", ".join(f'"{r}"' for r in replicas) or '"127.0.0.1:1"'
    path.write_text(
        "tiers: [small, medium, large]\nmodels:\n"
        f"  - name: {MODEL}\n    aliases: [demo]\n    checkpoint: {checkpoint}\n"
        "    context_length: 2048\n    default_max_tokens: 32\n    tier: small\n"
        f"    deployments:\n      - name: bench\n        replicas: [{listed}]\n",
        encoding="utf-8",
    )


def _write_policies(work: Path) -> Path:
    # No output rules: nothing is held back, so TTFT is the first token's.
    path = work / "policies.yaml"
    path.write_text("default:\n  output:\n    blocklist: []\n    redact: []\n", encoding="utf-8")
    return path


# --- the helper processes: tokenizer, auth, billing and cache, one process each -----------

DEP_SERVICES = ("tokenizer", "auth", "billing", "cache")


def _dep_spec(name: str, config: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(server settings, service spec, app) of one dependency, as its own process runs it."""
    from prometheus_client import CollectorRegistry

    from llm_common.config import ServerSettings

    server = ServerSettings(service_name=name, grpc_port=config[name], metrics_port=None)
    if name == "tokenizer":
        from llm_common.models_config import load_catalog
        from llm_common.tokenization.registry import load_registry
        from llm_tokenizer.config import Limits
        from llm_tokenizer.server import build_spec as tokenizer_spec

        catalog = load_catalog(Path(config["models"]), Path(config["work"]))
        return server, tokenizer_spec(load_registry(catalog), Limits()), None
    if name == "billing":
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
        return server, billing_spec(billing), None
    if name == "auth":
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
        return server, app.spec(), app
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
    return server, cache_spec(cache), None


async def _serve_dep(name: str, config: dict[str, Any]) -> None:
    """Serve one dependency until SIGTERM; auth also creates the benchmark's API key."""
    from llm_common.logging import configure_logging
    from llm_common.server import running as running_server

    # Logs go to stderr (a file): stdout is a pipe the parent reads only one line from.
    configure_logging(f"bench-{name}", os.environ.get("LOG_LEVEL", "WARNING"), stream=sys.stderr)
    server, spec, app = _dep_spec(name, config)
    async with running_server(server, spec):
        ready: dict[str, Any] = {"ready": name}
        if name == "auth":
            from llm_auth.principal import KeyLimits
            from llm_auth.testing import AuthHarness

            harness = AuthHarness(app, config["auth"], None)  # type: ignore[arg-type]
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
        await _forget_keys(config)


async def _forget_keys(config: dict[str, Any]) -> None:
    import redis.asyncio

    client = redis.asyncio.Redis.from_url(config["redis"])
    keys = [k async for k in client.scan_iter(match=f"{config['prefix']}*", count=500)]
    if keys:
        await client.delete(*keys)
    await client.aclose()


def _deps(logdir: Path, work: Path) -> tuple[list[Proc], dict[str, Any]]:
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
        args = [sys.executable, __file__, "--deps", json.dumps(config), "--dep", name]
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


# --- 1. overhead ---------------------------------------------------------------------------


def _user(text: str) -> common_pb2.ChatMessage:
    return common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure_skeleton(requests: int) -> dict[str, Any]:
    """The same call pattern with no logic (grpc_skeleton): the floor under the router."""
    leaf_port, middle_port = free_port(), free_port()
    leaf = grpc_skeleton.spawn("leaf", leaf_port)
    middle = grpc_skeleton.spawn("middle", middle_port, leaf_port)
    try:
        cpu_before = _cpu_s(middle.pid)
        result: dict[str, Any] = await grpc_skeleton.measure(leaf_port, middle_port, requests)
        result["middle_cpu_ms_per_request"] = round(
            (_cpu_s(middle.pid) - cpu_before) / (requests + 50) * 1e3, 3
        )
    finally:
        for process in (middle, leaf):
            process.terminate()
            process.wait()
    return result


async def measure_overhead(
    deps: dict[str, Any], routers: dict[str, Proc], replica: Proc, requests: int, tag: str
) -> dict[str, Any]:
    """Each round sends one request on every path (direct and each router), in random order.
    `tag` keeps each measurement's prompts apart from every other's (no cache hits)."""
    sampling = common_pb2.SamplingParams(
        temperature=0.0, max_tokens=OVERHEAD_MAX_TOKENS, ignore_eos=True
    )
    rng = random.Random(7)
    words = [rng.choice(WORDS) for _ in range(requests + 20)]
    # One prompt variant per router: routers share the response cache and must not hit each
    # other's entries. The direct path sends the first router's prompts.
    prompts = {
        name: [
            f"Question {tag}{chr(65 + n)}{i}: how far is the {w} from here?"
            for i, w in enumerate(words)
        ]
        for n, name in enumerate(routers)
    }
    prompts["direct"] = prompts[next(iter(routers))]
    async with contextlib.AsyncExitStack() as stack:
        channels = {
            name: await stack.enter_async_context(grpc.aio.insecure_channel(p.target))
            for name, p in routers.items()
        }
        inference = inf_grpc.InferenceServiceStub(
            await stack.enter_async_context(grpc.aio.insecure_channel(replica.target))
        )
        tokenizer = tok_grpc.TokenizerServiceStub(
            await stack.enter_async_context(grpc.aio.insecure_channel(deps["tokenizer"]))
        )
        ids = [
            list(
                (
                    await tokenizer.ApplyChatTemplate(
                        tok_pb.ApplyChatTemplateRequest(
                            model=MODEL, messages=[_user(p)], add_generation_prompt=True
                        )
                    )
                ).token_ids
            )
            for p in prompts["direct"]
        ]

        async def via_router(name: str, i: int) -> float:
            stub = pb_grpc.LLMServiceStub(channels[name])
            start = time.perf_counter()
            reply = await stub.Chat(
                pb.ChatRequest(model=MODEL, messages=[_user(prompts[name][i])], sampling=sampling),
                metadata=deps["metadata"],
            )
            assert reply.usage.completion_tokens == OVERHEAD_MAX_TOKENS
            return time.perf_counter() - start

        async def direct(i: int) -> float:
            start = time.perf_counter()
            request = inf_pb.GenerateRequest(
                request_id=uuid.uuid4().hex,
                prompt_token_ids=ids[i],
                sampling=sampling,
                detokenize=True,
            )
            tokens = sum([len(m.token_ids) async for m in inference.Generate(request)])
            assert tokens == OVERHEAD_MAX_TOKENS
            return time.perf_counter() - start

        async def run(path: str, i: int) -> float:
            return await (direct(i) if path == "direct" else via_router(path, i))

        paths = ["direct", *routers]
        for i in range(20):  # warm-up: connections, code paths, the engine
            for path in paths:
                await run(path, i)
        cpu_before = {name: _cpu_s(p.process.pid) for name, p in routers.items()}
        samples: dict[str, list[float]] = {path: [] for path in paths}
        for i in range(20, 20 + requests):
            for path in rng.sample(paths, len(paths)):
                samples[path].append(await run(path, i))
        cpu = {
            name: (_cpu_s(p.process.pid) - cpu_before[name]) / requests
            for name, p in routers.items()
        }
    direct_stats = Stats.of(samples["direct"])
    report: dict[str, Any] = {
        "requests_per_path": requests,
        "concurrency": 1,
        "max_tokens": OVERHEAD_MAX_TOKENS,
        "cache_service": bool(deps.get("cache")),
        "direct_ms": asdict(direct_stats),
    }
    for name in routers:
        stats = Stats.of(samples[name])
        paired = Stats.of([r - d for r, d in zip(samples[name], samples["direct"], strict=True)])
        report[name] = {
            "latency_ms": asdict(stats),
            "added_ms": {
                "p50": round(stats.p50 - direct_stats.p50, 3),
                "p99": round(stats.p99 - direct_stats.p99, 3),
                "paired_p50": paired.p50,
            },
            "router_cpu_ms_per_request": round(cpu[name] * 1e3, 3),
        }
    report["_samples"] = samples
    return report


# --- 2. prefix affinity vs round-robin -------------------------------------------------------


@dataclass
class Workload:
    prefixes: list[str]
    order: list[tuple[int, str]]  # (prefix index, question)


def make_workload(seed: int) -> Workload:
    rng = random.Random(seed)
    prefixes = [
        f"System {p}. " + " ".join(rng.choice(WORDS) for _ in range(PREFIX_WORDS))
        for p in range(PREFIXES)
    ]
    order = [
        (p, f"Question {q} about {rng.choice(WORDS)}?")
        for p in range(PREFIXES)
        for q in range(ASKS_PER_PREFIX)
    ]
    rng.shuffle(order)
    return Workload(prefixes, order)


@dataclass
class RunResult:
    ttft_s: list[float] = field(default_factory=list)
    prompt_tokens: int = 0
    cached_tokens: int = 0


async def run_workload(router: Proc, deps: dict[str, Any], workload: Workload) -> RunResult:
    result = RunResult()
    queue: asyncio.Queue[tuple[int, str]] = asyncio.Queue()
    for item in workload.order:
        queue.put_nowait(item)
    sampling = common_pb2.SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    async with grpc.aio.insecure_channel(router.target) as channel:
        stub = pb_grpc.LLMServiceStub(channel)

        async def client() -> None:
            while not queue.empty():
                p, question = queue.get_nowait()
                messages = [
                    common_pb2.ChatMessage(
                        role=common_pb2.ROLE_SYSTEM, content=workload.prefixes[p]
                    ),
                    _user(question),
                ]
                request = pb.ChatStreamRequest(
                    model=MODEL,
                    messages=messages,
                    sampling=sampling,
                    cache=pb.CachePolicy(bypass=True),
                )
                start, first = time.perf_counter(), None
                async for message in stub.ChatStream(request, metadata=deps["metadata"]):
                    if first is None and message.delta:
                        first = time.perf_counter() - start
                    if message.usage.prompt_tokens:
                        result.prompt_tokens += message.usage.prompt_tokens
                        result.cached_tokens += message.usage.cached_tokens
                result.ttft_s.append(first if first is not None else time.perf_counter() - start)

        await asyncio.gather(*(client() for _ in range(CONCURRENCY)))
    return result


async def measure_affinity(deps: dict[str, Any], logdir: Path, work: Path) -> dict[str, Any]:
    modes: dict[str, Any] = {}
    samples: dict[str, list[float]] = {}
    for seed, (label, balancer) in enumerate(
        (("round_robin", "round_robin"), ("affinity", "expected_wait"))
    ):
        replicas = [
            _inference(
                logdir, work, f"{label}-replica-{i}", prefix_caching=True, kv_mib=AFFINITY_KV_MIB
            )
            for i in range(2)
        ]
        async with running(replicas, logdir):
            router = _router(
                logdir, work, f"router-{label}", deps, [r.target for r in replicas], balancer
            )
            async with running([router], logdir):
                await asyncio.sleep(0.5)  # first load reports
                result = await run_workload(router, deps, make_workload(seed=100 + seed))
        stats = Stats.of(result.ttft_s)
        samples[label] = result.ttft_s
        modes[label] = {
            "balancer": balancer,
            "ttft_ms": asdict(stats),
            "prefix_cache_hit_ratio": round(result.cached_tokens / max(1, result.prompt_tokens), 3),
        }
    speedup = modes["round_robin"]["ttft_ms"]["mean"] / modes["affinity"]["ttft_ms"]["mean"]
    return {
        "replicas": 2,
        "prefixes": PREFIXES,
        "asks_per_prefix": ASKS_PER_PREFIX,
        "requests": PREFIXES * ASKS_PER_PREFIX,
        "concurrency": CONCURRENCY,
        "kv_cache_mib_per_replica": AFFINITY_KV_MIB,
        **modes,
        "mean_ttft_speedup": round(speedup, 2),
        "goal_speedup": GOAL_TTFT_SPEEDUP,
        "goal_met": speedup >= GOAL_TTFT_SPEEDUP,
        "_samples": samples,
    }


# --- main ------------------------------------------------------------------------------------


def _demo_checkpoint(model_root: Path) -> Path:
    name = "build_demo_model"
    spec = importlib.util.spec_from_file_location(
        name, ROOT / "infra" / "model" / "build_demo_model.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    built: Path = module.build(model_root / "demo-llama")
    return built


async def run(args: argparse.Namespace) -> dict[str, Any]:
    checkpoint = _demo_checkpoint(args.model_root.resolve())
    with tempfile.TemporaryDirectory(prefix="bench-router-") as tmp:
        work = Path(tmp)
        (work / "demo-llama").symlink_to(checkpoint)
        _write_models(work / "models.yaml", work / "demo-llama", [])
        logdir = args.logdir or work
        logdir.mkdir(parents=True, exist_ok=True)
        deps_procs, deps = _deps(logdir, work)
        try:
            replica = _inference(logdir, work, "overhead-replica", prefix_caching=False, kv_mib=16)
            async with running([replica], logdir):
                targets = [replica.target]
                default = _router(logdir, work, "router", deps, targets, "expected_wait")
                async with running([default], logdir):
                    await _attested(default)
                    # The goal's verdict: the default router and the replica alone, taking
                    # turns, before the variants start (their requests in between would
                    # leave every router's process cold for each of its own).
                    goal = await measure_overhead(
                        deps, {"router": default}, replica, args.requests, "G"
                    )
                    goal["goal_added_p50_ms"] = GOAL_ADDED_P50_MS
                    goal["goal_met"] = goal["router"]["added_ms"]["p50"] <= GOAL_ADDED_P50_MS
                    overhead = await _variants(deps, work, logdir, default, replica, args)
            affinity = await measure_affinity(deps, logdir, work)
        finally:
            for proc in deps_procs:
                _stop(proc)
    goal["grpc_skeleton"] = await measure_skeleton(args.requests)
    return {"overhead": goal, "variants": overhead, "prefix_affinity": affinity}


async def _variants(
    deps: dict[str, Any],
    work: Path,
    logdir: Path,
    default: Proc,
    replica: Proc,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """The default router beside its variants, all interleaved with the replica alone."""

    def variant(name: str, **env: str) -> Proc:
        return _router(logdir, work, name, deps, [replica.target], "expected_wait", **env)

    routers = {
        "router": default,
        "router_unattested": variant("router-unattested", ROUTER_TOKENIZER_ATTEST_INTERVAL_S="0"),
        "router_sequential_admission": variant(
            "router-sequential", ROUTER_OVERLAP_ADMISSION="false"
        ),
        "router_tokenize_service": variant("router-tokenize-service", ROUTER_TOKENIZE="service"),
        "router_tokenize_in_process": variant("router-tokenize-in-process", ROUTER_TOKENIZE="auto"),
        "router_per_token": variant(
            "router-per-token", ROUTER_TOKENS_PER_MESSAGE="1", ROUTER_UNARY_TOKENS_PER_MESSAGE="1"
        ),
    }
    variants = [p for name, p in routers.items() if name != "router"]
    async with running(variants, logdir):
        overhead = await measure_overhead(deps, routers, replica, args.requests, "V")
        for name, router in routers.items():
            assert router.metrics_port is not None
            overhead[name]["phase_mean_ms"] = phase_means_ms(router.metrics_port)
    return overhead


def _machine(load_before: tuple[float, float, float]) -> dict[str, Any]:
    return {
        # The cores may be shared with other work; the load average says how busy they were.
        "load_average_1m_before": round(load_before[0], 2),
        "load_average_1m_after": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "processes": "tokenizer, auth, billing, cache, inference x1-2, router: one process each",
    }


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    samples = result["variants"]["_samples"]
    for label in samples:
        ms = sorted(s * 1e3 for s in samples[label])
        left.plot(ms, [i / len(ms) for i in range(len(ms))], label=label)
    left.set(title="Chat latency, concurrency 1 (variants)", xlabel="ms", ylabel="CDF")
    left.legend()
    ttft = result["prefix_affinity"]["_samples"]
    for label in ("round_robin", "affinity"):
        ms = sorted(s * 1e3 for s in ttft[label])
        right.plot(ms, [i / len(ms) for i in range(len(ms))], label=label)
    right.set(title="TTFT, shared prefixes on 2 replicas", xlabel="ms", ylabel="CDF")
    right.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _strip_samples(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_samples(v) for k, v in value.items() if not k.startswith("_")}
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-root", type=Path, default=ROOT / ".cache" / "models")
    parser.add_argument("--requests", type=int, default=200, help="overhead requests per path")
    parser.add_argument("--out", type=Path, default=RESULTS / "router.json")
    parser.add_argument("--logdir", type=Path, help="keep the services' logs here")
    parser.add_argument("--deps", help=argparse.SUPPRESS)  # internal: run a helper process
    parser.add_argument("--dep", choices=DEP_SERVICES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.deps:
        asyncio.run(_serve_dep(args.dep, json.loads(args.deps)))
        return 0
    load_before = os.getloadavg()
    watch = machine.Run()
    result = asyncio.run(run(args))
    overhead = result["overhead"]
    overhead["machine_floor"] = machine.floor_note(
        GOAL_ADDED_P50_MS,
        overhead["grpc_skeleton"]["added_p50_ms"],
        "added p50 of the router's call pattern with no logic (grpc_skeleton), same run",
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    _plot(result, args.out.with_suffix(".png"))
    about = _machine(load_before) | watch.report()
    report = {"benchmark": "router", "machine": about, **_strip_samples(result)}
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
