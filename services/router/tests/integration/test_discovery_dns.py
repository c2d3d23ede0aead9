"""DNS discovery through a running router: a real DNS server on loopback (dnslib) whose
answers change during the test, real replicas on 127.0.0.x sharing one port (like pods behind
a headless Service). Replicas join after a probe, leave without a restart, and one serving
another model is refused and logged once."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from llm_common.models_config import Deployment, Discovery
from llm_common.server import running
from llm_inference.config import Limits as InferenceLimits
from llm_inference.config import Settings as InferenceSettings
from llm_inference.metrics import InferenceMetrics
from llm_inference.server import load_service
from llm_inference.weights_digest import weights_digest
from llm_router.clients.inference import InferenceClient, ReplicaChannels
from llm_router.routing.discovery.gate import Gate
from llm_testing import captured_logs, free_port, settings_for_tests
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

from .conftest import ENGINE, Stack, router_settings, running_router, wait_for, with_deployments
from .fleet import NAME, dns_server

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]


@contextlib.asynccontextmanager
async def replica(catalog_path: Path, host: str, port: int, model: str) -> AsyncIterator[None]:
    """A real inference replica bound to host:port (127.0.0.x)."""
    server = dataclasses.replace(settings_for_tests("inference"), grpc_port=port)
    settings = InferenceSettings(
        server=server, model=model, models_config=catalog_path, model_root=catalog_path.parent,
        replica_id=f"{host}:{port}", engine=ENGINE, limits=InferenceLimits(),
    )  # fmt: skip
    loaded = await load_service(settings, InferenceMetrics(model, CollectorRegistry()))
    async with running(server, loaded.spec, host=host):
        yield


def other_model_catalog(stack: Stack) -> Path:
    """The demo checkpoint under another model name: a replica that serves the wrong model."""
    text = (stack.workdir / "models.yaml").read_text("utf-8")
    path = stack.workdir / "other-models.yaml"
    renamed = text.replace("name: demo-llama", "name: other-llama").replace("[demo]", "[other]")
    path.write_text(renamed, "utf-8")
    return path


async def test_replicas_follow_the_dns_answers(stack: Stack, tmp_path: Path) -> None:
    port = free_port()
    catalog_path = stack.workdir / "models.yaml"
    with dns_server() as (records, dns_port), captured_logs("router") as logs:
        found = Discovery(kind="dns", service=NAME, port=port, interval_s=0.2,
                          nameserver=f"127.0.0.1:{dns_port}")  # fmt: skip
        deployment = Deployment(name="headless", discovery=found)
        catalog = with_deployments(stack.catalog, deployment)
        async with contextlib.AsyncExitStack() as replicas:
            await replicas.enter_async_context(replica(catalog_path, "127.0.0.2", port, "demo"))
            records.addresses = ["127.0.0.2"]
            settings = router_settings(stack, tmp_path)
            async with running_router(settings, catalog) as router:
                fleet = router.runtime.discovery.fleet

                async def members(expected: set[str]) -> bool:
                    return set(fleet.replicas(deployment)) == expected

                first, second = f"127.0.0.2:{port}", f"127.0.0.3:{port}"
                wrong = f"127.0.0.4:{port}"
                await wait_for(lambda: members({first}))
                caller = await stack.tenant()
                assert (await chat(router, caller.metadata)).usage.completion_tokens == 3

                # Scale out: a new replica and one serving another model appear in DNS.
                await replicas.enter_async_context(replica(catalog_path, "127.0.0.3", port, "demo"))
                other = other_model_catalog(stack)
                await replicas.enter_async_context(replica(other, "127.0.0.4", port, "other"))
                records.addresses = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
                await wait_for(lambda: members({first, second}))
                await wait_for(lambda: logs_refused(logs, wrong), timeout_s=5)
                # Probed again every second: still refused, still logged only once.
                await asyncio.sleep(2.5)
                assert len(refusals(logs, wrong)) == 1
                assert set(fleet.replicas(deployment)) == {first, second}

                # Scale in: the first leaves DNS and gets no new request.
                records.addresses = ["127.0.0.3"]
                await wait_for(lambda: members({second}))
                before = routed_to(router, first), routed_to(router, second)
                for _ in range(3):
                    assert (await chat(router, caller.metadata)).usage.completion_tokens == 3
                assert (routed_to(router, first), routed_to(router, second)) == (
                    before[0],
                    before[1] + 3,
                )


def routed_to(router: Any, replica: str) -> float:
    """Requests the router placed on `replica`, whatever the reason."""
    return sum(
        float(sample.value)
        for metric in router.registry.collect()
        if metric.name == "llm_router_routing_decisions"
        for sample in metric.samples
        if sample.name == "llm_router_routing_decisions_total"
        and sample.labels.get("replica") == replica
    )


async def chat(router: Any, metadata: Any) -> pb.ChatResponse:
    request = pb.ChatRequest(
        model="demo",
        messages=[common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content="hi")],
        sampling=common_pb2.SamplingParams(max_tokens=3, ignore_eos=True),
        cache=pb.CachePolicy(bypass=True),
    )
    reply: pb.ChatResponse = await router.stub.Chat(request, metadata=metadata, timeout=30)
    return reply


def refusals(logs: Any, replica: str) -> list[dict[str, Any]]:
    return [r for r in logs.events("discovered replica refused") if r.get("replica") == replica]


async def logs_refused(logs: Any, replica: str) -> bool:
    return bool(refusals(logs, replica))


async def test_a_replica_with_other_weights_is_refused_and_logged_once(
    stack: Stack, demo_model_dir: Path
) -> None:
    channels = ReplicaChannels()
    inference = InferenceClient(channels)
    replica_addr = stack.replica_addrs[0]
    actual = weights_digest(demo_model_dir)
    assert len(actual) == 64
    try:
        with captured_logs("router") as logs:
            strict = Gate(inference, "demo-llama", "pinned", digest="0" * 64)
            assert [await strict.admit(replica_addr) for _ in range(3)] == [False] * 3
            assert len(refusals(logs, replica_addr)) == 1
            assert "weights digest" in refusals(logs, replica_addr)[0]["reason"]
        assert await Gate(inference, "demo-llama", "pinned", digest=actual).admit(replica_addr)
        learning = Gate(inference, "demo-llama", "first", digest="")
        assert await learning.admit(replica_addr)
        assert learning.digest == actual  # the first admitted replica's weights set the digest
    finally:
        await channels.close()
