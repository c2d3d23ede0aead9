"""Kubernetes discovery with the official client against a real HTTP server that speaks the
API's list and watch protocol for EndpointSlices (newline-delimited JSON events on a held
response), and real replicas: ready endpoints join after a probe, not-ready and terminating
ones do not, a deleted slice takes its replicas out."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import queue
import random
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from prometheus_client import CollectorRegistry

from llm_common.models_config import Deployment, Discovery
from llm_common.server import running
from llm_inference.config import Limits as InferenceLimits
from llm_inference.config import Settings as InferenceSettings
from llm_inference.metrics import InferenceMetrics
from llm_inference.server import load_service
from llm_router.clients.inference import InferenceClient, ReplicaChannels
from llm_router.routing.discovery.fleet import Fleet
from llm_router.routing.discovery.gate import Gate
from llm_router.routing.discovery.k8s_source import EndpointSliceSource
from llm_router.routing.discovery.watcher import DeploymentWatch
from llm_router.routing.load import Health, LoadBoard
from llm_router.routing.load_watch import LoadWatcher
from llm_router.routing.prefix import AffinityTable
from llm_router.routing.selection import ReplicaSelector
from llm_router.routing.settings import RoutingSettings
from llm_testing import free_port, settings_for_tests

from .conftest import ENGINE, MODEL, Stack, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]
NAMESPACE, SERVICE = "llm", "inference"
BASE = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"


def endpoint_slice(name: str, version: int, port: int, **endpoints: str) -> dict[str, Any]:
    """An EndpointSlice; `endpoints` maps an address to ready, not_ready or terminating."""
    conditions = {
        "ready": {"ready": True},
        "not_ready": {"ready": False},
        "terminating": {"ready": True, "terminating": True},
    }
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": name, "namespace": NAMESPACE, "resourceVersion": str(version),
                     "labels": {"kubernetes.io/service-name": SERVICE}},
        "endpoints": [
            {"addresses": [a.replace("_", ".")], "conditions": conditions[state]}
            for a, state in endpoints.items()
        ],
        "ports": [{"name": "grpc", "port": port, "protocol": "TCP"}],
    }  # fmt: skip


class ApiServer:
    """list returns `items`; a watch streams what `events` is fed, one JSON line each."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.selectors: list[str] = []

    def handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                path, _, query = self.path.partition("?")
                assert path == BASE, path
                api.selectors.append(query)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if "watch=true" not in query:
                    listed = {"kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                              "metadata": {"resourceVersion": "1"}, "items": api.items}  # fmt: skip
                    body = json.dumps(listed).encode()
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                # A watch: one chunk per event, as the API server streams them.
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while (event := api.events.get()) is not None:
                    line = json.dumps(event).encode() + b"\n"
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.close_connection = True

            def log_message(self, *args: Any) -> None:
                """Quiet."""

        return Handler


@contextlib.contextmanager
def api_server() -> Iterator[tuple[ApiServer, str]]:
    api = ApiServer()
    server = ThreadingHTTPServer(("127.0.0.1", 0), api.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        api.events.put(None)
        server.shutdown()
        server.server_close()


@contextlib.asynccontextmanager
async def replica(catalog_path: Path, host: str, port: int) -> AsyncIterator[None]:
    server = dataclasses.replace(settings_for_tests("inference"), grpc_port=port)
    settings = InferenceSettings(
        server=server, model="demo", models_config=catalog_path, model_root=catalog_path.parent,
        replica_id=f"{host}:{port}", engine=ENGINE, limits=InferenceLimits(),
    )  # fmt: skip
    loaded = await load_service(settings, InferenceMetrics(MODEL, CollectorRegistry()))
    async with running(server, loaded.spec, host=host):
        yield


async def test_endpointslice_changes_move_replicas_in_and_out(stack: Stack) -> None:
    port = free_port()
    found = Discovery(kind="kubernetes", service=SERVICE, namespace=NAMESPACE, port=port)
    deployment = Deployment(name="pods", discovery=found)
    channels = ReplicaChannels()
    inference = InferenceClient(channels)
    board = LoadBoard(exclude_s=5, exclude_max_s=60, stale_s=2)
    selector = ReplicaSelector(
        board, AffinityTable(max_entries=100, ttl_s=60), RoutingSettings(), random.Random(1)
    )
    load = LoadWatcher(inference, board, selector, [], interval_ms=50)
    fleet = Fleet()
    catalog_path = stack.workdir / "models.yaml"
    with api_server() as (api, url):
        api.items = [endpoint_slice("inf-a", 1, port, **{"127_0_0_5": "ready"})]

        def api_client() -> client.ApiClient:
            return client.ApiClient(client.Configuration(host=url))

        source = EndpointSliceSource(found, api_client)
        gate = Gate(inference, MODEL, deployment.name, "")
        watch = DeploymentWatch(deployment, source, gate, fleet, load)
        async with contextlib.AsyncExitStack() as running_replicas:
            for host in ("127.0.0.5", "127.0.0.6", "127.0.0.7", "127.0.0.8"):
                await running_replicas.enter_async_context(replica(catalog_path, host, port))
            task = asyncio.get_running_loop().create_task(watch.run())

            async def members(*hosts: str) -> bool:
                return set(fleet.replicas(deployment)) == {f"{h}:{port}" for h in hosts}

            try:
                await wait_for(lambda: members("127.0.0.5"))
                assert gate.digest  # the first admitted replica's weights define the digest
                await wait_for(
                    lambda: _true(board.health(f"127.0.0.5:{port}") == Health.FRESH)
                )  # its load stream was opened
                api.events.put({"type": "MODIFIED", "object": endpoint_slice(
                    "inf-a", 2, port,
                    **{"127_0_0_5": "ready", "127_0_0_6": "ready", "127_0_0_7": "not_ready"},
                )})  # fmt: skip
                api.events.put({"type": "ADDED", "object": endpoint_slice(
                    "inf-b", 3, port, **{"127_0_0_8": "terminating"})})  # fmt: skip
                await wait_for(lambda: members("127.0.0.5", "127.0.0.6"))
                api.events.put({"type": "DELETED", "object": endpoint_slice(
                    "inf-a", 4, port, **{"127_0_0_5": "ready"})})  # fmt: skip
                await wait_for(lambda: members())
                api.events.put({"type": "MODIFIED", "object": endpoint_slice(
                    "inf-b", 5, port, **{"127_0_0_8": "ready"})})  # fmt: skip
                await wait_for(lambda: members("127.0.0.8"))
            finally:
                task.cancel()
                await load.stop()
                await channels.close()
    # One list, then a watch from the listed version, both for the Service's slices only.
    label = "labelSelector=kubernetes.io/service-name%3Dinference"
    assert api.selectors[0] == label
    assert api.selectors[1].startswith(f"{label}&resourceVersion=1&")
    assert "watch=true" in api.selectors[1]


async def _true(value: bool) -> bool:
    return value
