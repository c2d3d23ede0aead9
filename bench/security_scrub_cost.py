"""What the edge's query scrub (a Lua filter on every request, llm_envoy.query_scrub) adds to
a request's latency: a `/v1/models` request that Envoy answers itself (no auth is running:
ext_authz fails closed at once, the same 503 in both configs), timed over one keep-alive
connection with and without a query string, on the rendered edge with the Lua filter and on
the same config without it."""

from __future__ import annotations

import asyncio
import http.client
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from llm_envoy import xds
from llm_envoy.query_scrub import LUA
from llm_envoy.testing import RunningEdge, running_edge

PATHS = {"no_query": "/v1/models", "with_query": "/v1/models?model=demo&api_key=sk-x&limit=3"}
ANSWER = 503  # ext_authz without auth: fail closed


def _without_lua(workdir: Path) -> None:
    lds = workdir / xds.XDS_DIR / xds.LDS_FILE
    data = yaml.safe_load(lds.read_text())
    for listener in data["resources"]:
        for chain in listener["filter_chains"]:
            for network_filter in chain["filters"]:
                typed = network_filter["typed_config"]
                if "http_filters" in typed:
                    typed["http_filters"] = [f for f in typed["http_filters"] if f["name"] != LUA]
    lds.write_text(yaml.safe_dump(data, sort_keys=False))


def _connect(edge: RunningEdge) -> http.client.HTTPConnection:
    host, _, port = edge.edge_http.rpartition(":")
    return http.client.HTTPConnection(host, int(port), timeout=5)


def _once(conn: http.client.HTTPConnection, path: str) -> float:
    started = time.perf_counter()
    conn.request("GET", path)
    reply = conn.getresponse()
    reply.read()
    assert reply.status == ANSWER, reply.status
    return (time.perf_counter() - started) * 1e6


def _summary(samples: list[float]) -> dict[str, float]:
    samples = sorted(samples)
    return {
        "p50_us": round(statistics.median(samples), 1),
        "p99_us": round(samples[int(len(samples) * 0.99) - 1], 1),
    }


def _interleaved(edges: dict[str, RunningEdge], requests: int) -> dict[str, Any]:
    """Both configs at once, requests alternating between them in small rounds, so load
    from elsewhere on the machine falls on both alike."""
    conns = {name: _connect(edge) for name, edge in edges.items()}
    samples: dict[str, dict[str, list[float]]] = {n: {p: [] for p in PATHS} for n in edges}
    try:
        for round_ in range(requests // 10 + requests // 100):
            for path_name, path in PATHS.items():
                for name, conn in conns.items():
                    taken = [_once(conn, path) for _ in range(10)]
                    if round_ >= requests // 100:  # the first rounds warm up
                        samples[name][path_name] += taken
    finally:
        for conn in conns.values():
            conn.close()
    return {n: {p: _summary(s) for p, s in by_path.items()} for n, by_path in samples.items()}


async def _measure(protos: Path, requests: int) -> dict[str, Any]:
    with_dir = Path(tempfile.mkdtemp(prefix="bench-scrub-"))
    without_dir = Path(tempfile.mkdtemp(prefix="bench-noscrub-"))
    async with (
        running_edge(with_dir, protos, auth=None) as with_scrub,
        running_edge(without_dir, protos, auth=None, patch=_without_lua) as without_scrub,
    ):
        edges = {"with_scrub": with_scrub, "without_scrub": without_scrub}
        return await asyncio.to_thread(_interleaved, edges, requests)


def scrub_cost(protos: Path, requests: int) -> dict[str, Any]:
    """Latency through the edge with the scrub and without it (same run, interleaved)."""
    found = asyncio.run(_measure(protos, requests))
    found["added_p50_us"] = {
        name: round(found["with_scrub"][name]["p50_us"] - found["without_scrub"][name]["p50_us"], 1)
        for name in PATHS
    }
    found["requests"] = requests
    return found
