"""The Prometheus endpoint and RPC metrics."""

from __future__ import annotations

import asyncio
import urllib.request

from prometheus_client import CollectorRegistry

from llm_common.metrics import RpcMetrics, serve_metrics, split_method, start_metrics_server


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        body: bytes = response.read()
    return body.decode()


async def test_endpoint_serves_rpc_counters(registry: CollectorRegistry) -> None:
    metrics = RpcMetrics(registry)
    metrics.started("llmapi.llm.v1.LLMService", "Chat")
    metrics.finished("llmapi.llm.v1.LLMService", "Chat", "OK", 0.02)
    endpoint = serve_metrics(0, registry, addr="127.0.0.1")
    try:
        assert endpoint.port > 0
        body = await asyncio.to_thread(_scrape, endpoint.port)
    finally:
        endpoint.close()
    labels = 'code="OK",method="Chat",service="llmapi.llm.v1.LLMService"'
    assert f"llm_rpc_requests_total{{{labels}}} 1.0" in body
    assert (
        'llm_rpc_duration_seconds_count{method="Chat",service="llmapi.llm.v1.LLMService"} 1.0'
        in body
    )
    assert 'llm_rpc_in_flight{method="Chat",service="llmapi.llm.v1.LLMService"} 0.0' in body


async def test_start_metrics_server_returns_the_bound_port(registry: CollectorRegistry) -> None:
    RpcMetrics(registry)
    port = start_metrics_server(0, registry)
    assert "# TYPE llm_rpc_requests_total counter" in await asyncio.to_thread(_scrape, port)


def test_split_method() -> None:
    assert split_method("/llmapi.llm.v1.LLMService/Chat") == ("llmapi.llm.v1.LLMService", "Chat")
    assert split_method("garbage") == ("unknown", "garbage")


def test_each_method_and_code_counts_apart(registry: CollectorRegistry) -> None:
    metrics = RpcMetrics(registry)
    for code in ("OK", "OK", "NOT_FOUND"):
        metrics.started("a.v1.S", "Get")
        metrics.finished("a.v1.S", "Get", code, 0.003)
    metrics.started("a.v1.S", "Put")
    sample = registry.get_sample_value
    get, put = {"service": "a.v1.S", "method": "Get"}, {"service": "a.v1.S", "method": "Put"}
    assert sample("llm_rpc_requests_total", {**get, "code": "OK"}) == 2
    assert sample("llm_rpc_requests_total", {**get, "code": "NOT_FOUND"}) == 1
    assert sample("llm_rpc_duration_seconds_count", get) == 3
    assert sample("llm_rpc_in_flight", get) == 0
    assert sample("llm_rpc_in_flight", put) == 1
    assert sample("llm_rpc_requests_total", {**put, "code": "OK"}) is None
