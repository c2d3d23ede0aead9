"""Issue 32, findings 2 and 3: what oversized uploads cost the edge Envoy, with and without the
edge's body limit and the transcoder fix, in the same run.

The rendered local edge on a real Envoy with a real auth (Redis) and recording stand-ins for
the router (`llm_envoy.testing`). Per configuration (`before_fix`: no body limit and the
transcoder as it was; `limit_on`: the default policy) and per route (REST transcoding
`/llmapi.llm.v1.LLMService/Chat`, the same with a query string, OpenAI
`/v1/chat/completions`), `--parallel` clients each POST `--mb` MB at once while Envoy's admin
`/memory` is sampled every 50 ms; reported: heap before and at its peak (`allocated`,
`heap_size`), Envoy's RSS peak, the answers' statuses, how many uploads reached the router,
and the wall time.

Also the latency the edge's query scrub (Lua) adds (`security_scrub_cost`, "query_scrub").

Writes bench/results/security.json ("envoy_heap" per configuration and route, "query_scrub").
Usage: python bench/bench_security.py [--mb 50] [--parallel 8] [--scrub-requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from security_scrub_cost import scrub_cost

from llm_auth.testing import delete_prefix, make_settings, serving, unique_prefix
from llm_envoy import xds
from llm_envoy.filters import TRANSCODER
from llm_envoy.policy import load_policy
from llm_envoy.policy_model import MeshPolicy
from llm_envoy.testing import AuthPorts, RunningEdge, admin_get, post_body, running_edge
from llm_envoy.topology import LLM_SERVICE
from llm_testing import redis_url_for_tests

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PROTOS = ROOT / "protos"
ROUTES = {
    "rest_chat": f"/{LLM_SERVICE}/Chat",
    "rest_chat_query": f"/{LLM_SERVICE}/Chat?trace=1",
    "openai_chat": "/v1/chat/completions",
}
MIB = 1024 * 1024


@dataclasses.dataclass
class Sampler:
    """Envoy's heap (admin /memory) and RSS, sampled until stopped; peaks kept."""

    edge: RunningEdge
    peak_allocated: int = 0
    peak_heap: int = 0
    peak_rss: int = 0
    stop: threading.Event = dataclasses.field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            allocated, heap = memory(self.edge)
            self.peak_allocated = max(self.peak_allocated, allocated)
            self.peak_heap = max(self.peak_heap, heap)
            self.peak_rss = max(self.peak_rss, rss(self.edge.process.pid))
            time.sleep(0.05)


def memory(edge: RunningEdge) -> tuple[int, int]:
    data = json.loads(admin_get(edge.admin, "/memory"))
    return int(data["allocated"]), int(data["heap_size"])


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def attack(edge: RunningEdge, key: str, path: str, size: int, parallel: int) -> dict[str, Any]:
    """`parallel` uploads of `size` bytes at once; heap and answers."""
    time.sleep(1.0)  # let the previous round's memory settle
    before_allocated, before_heap = memory(edge)
    calls_before = len(edge.recorder.grpc_calls) + len(edge.recorder.http_requests)
    sampler = Sampler(edge)
    watcher = threading.Thread(target=sampler.run, daemon=True)
    watcher.start()
    headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    statuses: list[int] = []

    def upload() -> None:
        statuses.append(post_body(edge.edge_http, path, headers, size).status)

    started = time.perf_counter()
    workers = [threading.Thread(target=upload) for _ in range(parallel)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    elapsed = time.perf_counter() - started
    time.sleep(0.3)
    sampler.stop.set()
    watcher.join()
    calls = len(edge.recorder.grpc_calls) + len(edge.recorder.http_requests) - calls_before
    return {
        "uploads": parallel,
        "upload_mib": size / MIB,
        "statuses": dict(Counter(str(s) for s in statuses)),
        "reached_router": calls,
        "heap_allocated_before_mib": round(before_allocated / MIB, 1),
        "heap_allocated_peak_mib": round(sampler.peak_allocated / MIB, 1),
        "heap_size_before_mib": round(before_heap / MIB, 1),
        "heap_size_peak_mib": round(sampler.peak_heap / MIB, 1),
        "rss_peak_mib": round(sampler.peak_rss / MIB, 1),
        "wall_s": round(elapsed, 2),
    }


async def measure(variant: Variant, mb: int, parallel: int) -> dict[str, Any]:
    redis_url = redis_url_for_tests()
    prefix = unique_prefix()
    try:
        async with serving(make_settings(redis_url, prefix, http_authz_port=0)) as auth:
            assert auth.app.http_authz is not None
            _, key = await auth.create_key(f"bench-{uuid.uuid4().hex[:8]}")
            ports = AuthPorts(grpc=auth.port, http=auth.app.http_authz.port)
            workdir = Path(tempfile.mkdtemp(prefix="bench-security-"))
            healthy = ("router", "auth_http")
            async with running_edge(
                workdir,
                PROTOS,
                auth=ports,
                policy=variant.policy,
                healthy=healthy,
                patch=variant.patch,
            ) as edge:
                found = {}
                for name, path in ROUTES.items():
                    found[name] = await asyncio.to_thread(
                        attack, edge, key.text, path, mb * 1_000_000, parallel
                    )
                return found
    finally:
        await delete_prefix(redis_url, prefix)


@dataclasses.dataclass(frozen=True)
class Variant:
    policy: MeshPolicy
    patch: Callable[[Path], None] | None = None


def variants() -> dict[str, Variant]:
    """The fix and the config before it: no body limit, and the transcoder without
    `ignore_unknown_query_parameters` (a query string made it pass the JSON body through
    untranscoded, streamed to the router: the finding's 429 "message larger than max")."""
    on = load_policy()
    off_limits = dataclasses.replace(on.edge.limits, max_request_body_bytes=None)
    off = dataclasses.replace(on, edge=dataclasses.replace(on.edge, limits=off_limits))
    return {"before_fix": Variant(off, _transcoder_as_before), "limit_on": Variant(on)}


def _transcoder_as_before(workdir: Path) -> None:
    lds = workdir / xds.XDS_DIR / xds.LDS_FILE
    data = yaml.safe_load(lds.read_text())
    for listener in data["resources"]:
        for chain in listener["filter_chains"]:
            for network_filter in chain["filters"]:
                for http_filter in network_filter["typed_config"].get("http_filters", []):
                    if http_filter["name"] == TRANSCODER:
                        http_filter["typed_config"].pop("ignore_unknown_query_parameters")
    lds.write_text(yaml.safe_dump(data, sort_keys=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--parallel", type=int, default=8)
    parser.add_argument("--scrub-requests", type=int, default=2000)
    args = parser.parse_args()
    heap: dict[str, Any] = {}
    for name, variant in variants().items():
        heap[name] = asyncio.run(measure(variant, args.mb, args.parallel))
        print(name, json.dumps(heap[name], indent=1), flush=True)
    limit = load_policy().edge.limits.max_request_body_bytes
    scrub = scrub_cost(PROTOS, args.scrub_requests)
    print("query_scrub", json.dumps(scrub, indent=1), flush=True)
    result = {"max_request_body_bytes": limit, "envoy_heap": heap, "query_scrub": scrub}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "security.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS / 'security.json'}")


if __name__ == "__main__":
    main()
