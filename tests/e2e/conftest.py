"""The whole platform, started once per session by the `make up` supervisor on free ports:
Redis (the test Redis, under a key prefix of its own), the six services, Envoy, and an OTLP
receiver in this process that every component exports its spans to."""

from __future__ import annotations

import asyncio
import importlib.util
import socket
import threading
import uuid
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

REPO = Path(__file__).resolve().parents[2]
PACKAGES = (
    "llm_auth",
    "llm_tokenizer",
    "llm_router",
    "llm_inference",
    "llm_cache",
    "llm_billing",
    "llm_stack",
    "llm_envoy",
)


@dataclass(frozen=True, slots=True)
class Span:
    service: str
    trace_id: str
    name: str


@dataclass
class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace collector that keeps every span it is sent."""

    spans: list[Span] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    port: int = 0

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802
        received = []
        for resource_spans in request.resource_spans:
            attributes = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            service = attributes.get("service.name", "")
            for scope in resource_spans.scope_spans:
                received += [Span(service, s.trace_id.hex(), s.name) for s in scope.spans]
        with self.lock:
            self.spans.extend(received)
        return trace_service_pb2.ExportTraceServiceResponse()

    def services_in(self, trace_id: str) -> set[str]:
        with self.lock:
            return {s.service for s in self.spans if s.trace_id == trace_id}


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)  # type: ignore[no-untyped-call]
    receiver.port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield receiver
    server.stop(grace=None)


@dataclass(frozen=True)
class RunningStack:
    """The started platform and the credentials the tests use."""

    endpoints: Any  # llm_stack.stack.Endpoints
    admin_key: str
    demo_key: str
    router_http_port: int
    redis_url: str
    prefix: str

    @property
    def edge(self) -> str:
        edge: str = self.endpoints.edge_http
        return edge

    def create_key(self, **kwargs: Any) -> str:
        from llm_stack.demo import create_key

        return create_key(self.edge, self.admin_key, **kwargs)


E2E_FAILED_AUTH_LIMIT = 200


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class _OpenAIFallback:
    """Hosts the router's OpenAI translator here while the router does not start it itself:
    the same code on the port the edge routes /v1/ to, in front of the real router."""

    def __init__(self, port: int, router: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        from llm_router.api.openai_http import start_openai_http

        started = asyncio.run_coroutine_threadsafe(
            start_openai_http("127.0.0.1", port, router), self._loop
        )
        self._listener = started.result(timeout=10)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._listener.close(grace_s=1), self._loop).result(
            timeout=10
        )
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)


@pytest.fixture(scope="session")
def stack(
    tmp_path_factory: pytest.TempPathFactory, redis_url: str, otlp_receiver: OtlpReceiver
) -> Iterator[RunningStack]:
    missing = [name for name in PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        pytest.skip(f"service packages not installed: {', '.join(missing)}")
    from llm_envoy.topology import Endpoint
    from llm_stack import catalogue
    from llm_stack.config import StackConfig, free_ports
    from llm_stack.demo import create_key
    from llm_stack.stack import Stack

    prefix = f"e2e{uuid.uuid4().hex[:10]}:"
    config = StackConfig.from_env(REPO, {"LLM_RUN_DIR": str(tmp_path_factory.mktemp("stack"))})
    replicas = catalogue.local_replicas(config.models_config)
    config = replace(
        config.with_ports(free_ports(tuple(r.port for r in replicas))),
        redis_url=redis_url,
        redis_prefix=prefix,
        otlp=Endpoint("127.0.0.1", otlp_receiver.port),
        log_level="INFO",
    )
    running = Stack(config)
    with pytest.MonkeyPatch.context() as env:
        # The router counts prompts itself while the tokenizer attests its files, so a request
        # reaches the tokenizer only as a sampled audit: here every one is audited, and so
        # every service has a part in each request's trace (test_stack_observability).
        env.setenv("ROUTER_TOKENIZER_AUDIT_RATE", "1")
        # Every test calls from 127.0.0.1, the fuzzers with many bad credentials: a limit well
        # above what they send, which test_security_edge still reaches on purpose.
        env.setenv("AUTH_FAILED_AUTH_LIMIT", str(E2E_FAILED_AUTH_LIMIT))
        endpoints = running.start()
    fallback = None
    try:
        assert running.credentials is not None
        admin_key = running.credentials.admin_key
        router_http = config.ports.envoy.router_http
        if not _listening(router_http):
            fallback = _OpenAIFallback(router_http, endpoints.router)
        demo_key = create_key(endpoints.edge_http, admin_key, requests_per_minute=0)
        yield RunningStack(endpoints, admin_key, demo_key, router_http, redis_url, prefix)
    finally:
        if fallback is not None:
            fallback.close()
        running.stop()
        _delete_prefix(redis_url, prefix)


def _delete_prefix(url: str, prefix: str) -> None:
    client = redis.Redis.from_url(url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        for start in range(0, len(keys), 500):
            client.delete(*keys[start : start + 500])
    finally:
        client.close()
