"""The chosen replica reached through an Envoy mesh listener: an ORIGINAL_DST cluster that
takes the destination from the router's header (the real Envoy binary)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from llm_auth.testing import running_envoy
from llm_testing import free_port
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

from .conftest import (
    HOLDING,
    Stack,
    cancel_while_generating,
    deployment,
    router_settings,
    running_router,
    wait_for,
    with_deployments,
)

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="session")]

HCM = (
    "type.googleapis.com/"
    "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
)
MESH_ENVOY = """
admin:
  address: {socket_address: {address: 127.0.0.1, port_value: 0}}
static_resources:
  listeners:
  - name: mesh
    address: {socket_address: {address: 127.0.0.1, port_value: $port}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": $hcm
          stat_prefix: mesh
          codec_type: HTTP2
          route_config:
            virtual_hosts:
            - name: inference
              domains: ["*"]
              routes:
              - match: {prefix: "/llmapi.inference.v1.InferenceService/"}
                route: {cluster: inference_replicas, timeout: 0s}
          http_filters:
          - name: envoy.filters.http.router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: inference_replicas
    type: ORIGINAL_DST
    lb_policy: CLUSTER_PROVIDED
    connect_timeout: 1s
    original_dst_lb_config:
      use_http_header: true
      http_header_name: x-envoy-original-dst-host
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http2_protocol_options: {}}
"""


async def test_generation_through_an_original_dst_mesh(stack: Stack, tmp_path: Path) -> None:
    port = free_port()
    config = MESH_ENVOY.replace("$port", str(port)).replace("$hcm", HCM)
    async with running_envoy(config, tmp_path / "envoy") as envoy:
        settings = router_settings(stack, tmp_path)
        # Replicas hold tokens (Stop must find the right one through the mesh, below).
        routing = dataclasses.replace(HOLDING, mesh_addr=f"127.0.0.1:{port}")
        settings = dataclasses.replace(settings, routing=routing)
        catalog = with_deployments(stack.catalog, deployment("d", stack.replica_addrs))
        caller = await stack.tenant()
        async with running_router(settings, catalog) as router:

            async def reported() -> bool:
                board = router.runtime.board
                return all(board.health(r) == "fresh" for r in stack.replica_addrs)

            await wait_for(reported)  # WatchLoad also goes through the mesh
            for i in range(4):
                reply = await router.stub.Chat(
                    pb.ChatRequest(
                        model="demo",
                        messages=[
                            common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=f"q{i}")
                        ],
                        sampling=common_pb2.SamplingParams(max_tokens=2, ignore_eos=True),
                        cache=pb.CachePolicy(bypass=True),
                    ),
                    metadata=caller.metadata,
                )
                assert reply.usage.completion_tokens == 2
            # A cancelled stream is stopped on its replica, through the mesh, and billed the
            # replica's exact count.
            other = await stack.tenant()
            billed, generated = await cancel_while_generating(
                router, stack, other.tenant, other.metadata
            )
            assert 20 < billed == generated
        stats = await envoy.stats("cluster.inference_replicas.")
    # 5 Generate calls, a Stop and 2 WatchLoad streams, all through Envoy.
    assert stats["cluster.inference_replicas.upstream_rq_total"] >= 8
    assert stats.get("cluster.inference_replicas.upstream_cx_connect_fail", 0) == 0
