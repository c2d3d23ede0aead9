"""One trace from the edge through every service; metrics from every process; access logs."""

from __future__ import annotations

import json
import secrets
import time
import urllib.request

import grpc
import pytest

from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc

from .conftest import OtlpReceiver, RunningStack

pytestmark = pytest.mark.e2e

# service.name of every component a chat request passes: Envoy's edge and mesh, the services.
EXPECTED_SERVICES = {
    "llm-edge",
    "llm-edge-mesh",
    "auth",
    "router",
    "tokenizer",
    "cache",
    "billing",
    "inference",
}
TRACE_WAIT_S = 20.0  # Envoy flushes every second, the services' batch processors every 5 s


def chat_once(stack: RunningStack, traceparent: str, text: str) -> None:
    request = pb.ChatStreamRequest(
        model="demo",
        messages=[common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)],
        sampling=common_pb2.SamplingParams(max_tokens=3, temperature=0),
    )
    metadata = (("authorization", f"Bearer {stack.demo_key}"), ("traceparent", traceparent))
    with grpc.insecure_channel(stack.edge) as channel:
        list(pb_grpc.LLMServiceStub(channel).ChatStream(request, metadata=metadata, timeout=60))


def test_one_trace_spans_envoy_and_every_service(
    stack: RunningStack, otlp_receiver: OtlpReceiver
) -> None:
    trace_id = secrets.token_hex(16)
    chat_once(stack, f"00-{trace_id}-{secrets.token_hex(8)}-01", f"trace me {trace_id[:8]}")
    deadline = time.monotonic() + TRACE_WAIT_S
    while not otlp_receiver.services_in(trace_id) >= EXPECTED_SERVICES:
        if time.monotonic() > deadline:
            missing = EXPECTED_SERVICES - otlp_receiver.services_in(trace_id)
            pytest.fail(f"no spans of trace {trace_id} from {sorted(missing)}")
        time.sleep(0.25)


def scrape(address: str, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://{address}{path}", timeout=5) as response:
        body: str = response.read().decode()
    return body


def test_every_service_exports_rpc_metrics(stack: RunningStack) -> None:
    chat_once(stack, f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01", "metrics")
    for process, address in stack.endpoints.metrics.items():
        body = scrape(address)
        served = [line for line in body.splitlines() if line.startswith("llm_rpc_requests_total{")]
        assert served, f"{process} exported no llm_rpc_requests_total"
        assert any('code="OK"' in line for line in served), process
    envoy = scrape(stack.endpoints.admin, "/stats/prometheus")
    assert 'envoy_cluster_upstream_rq_total{envoy_cluster_name="router"}' in envoy
    assert (
        "envoy_cluster_health_check_healthy" in envoy
        or "envoy_cluster_health_check_success" in envoy
    )


def test_the_edge_writes_json_access_logs_with_trace_ids(stack: RunningStack) -> None:
    trace_id = secrets.token_hex(16)
    chat_once(stack, f"00-{trace_id}-{secrets.token_hex(8)}-01", "access log")
    log = stack.endpoints.ca_cert.parents[2] / "logs" / "envoy.log"
    deadline = time.monotonic() + 10  # Envoy buffers stdout for about a second
    while True:
        records = [
            json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")
        ]
        mine = [r for r in records if r.get("trace_id") == trace_id]
        if mine or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    edge = [r for r in mine if r["listener"] == "edge_http"]
    assert edge, "no access log line for the request"
    assert edge[0]["path"] == "/llmapi.llm.v1.LLMService/ChatStream"
    assert str(edge[0]["grpc_status"]) == "0"
    assert edge[0]["tenant"] == "demo"


def _exposed_names(stack: RunningStack) -> set[str]:
    names: set[str] = set()
    bodies = [scrape(a) for a in stack.endpoints.metrics.values()]
    bodies.append(scrape(stack.endpoints.admin, "/stats/prometheus"))
    for body in bodies:
        for line in body.splitlines():
            if line.startswith("# TYPE "):
                names.add(line.split()[2])
            elif line and not line.startswith("#"):
                names.add(line.split("{")[0].split(" ")[0])
    return names


def _referenced_names() -> set[str]:
    import re

    import yaml

    from .conftest import REPO

    expressions = [
        rule["expr"]
        for group in yaml.safe_load((REPO / "infra/prometheus/alerts.yml").read_text())["groups"]
        for rule in group["rules"]
    ]
    dashboard = json.loads((REPO / "infra/grafana/llm-platform.json").read_text())
    expressions += [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    # Label names live in selectors and by/without clauses: drop those before matching.
    labels = re.compile(r"\{[^}]*\}|\b(?:by|without)\s*\([^)]*\)")
    pattern = re.compile(r"\b((?:llm_|envoy_|vllm:)[A-Za-z0-9_:]+)")
    return {name for expr in expressions for name in pattern.findall(labels.sub(" ", expr))}


def test_alerts_and_dashboard_use_metrics_the_stack_exports(stack: RunningStack) -> None:
    exposed = _exposed_names(stack)
    suffixes = ("_bucket", "_count", "_sum", "_total")
    missing = sorted(
        name
        for name in _referenced_names()
        if name not in exposed and not any(name.removesuffix(s) in exposed for s in suffixes)
    )
    assert not missing, f"alerts or dashboard name metrics nobody exports: {missing}"
