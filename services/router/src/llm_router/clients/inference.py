"""llmapi.inference.v1: the replicas, directly or through the mesh (Generate, Stop, Embed,
WatchLoad, and the health + Info probe of a newly discovered replica)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llm_common.channels import make_channel
from llm_common.server_tls import ServerTls
from llm_router.routing.load import LoadSnapshot
from llm_router.routing.replica_stream import GenerateCall, replica_error
from llmapi.inference.v1 import inference_service_pb2 as inf_pb
from llmapi.inference.v1 import inference_service_pb2_grpc as inf_grpc

INFERENCE_SERVICE = inf_pb.DESCRIPTOR.services_by_name["InferenceService"].full_name


class ReplicaChannels:
    """How to reach a replica: directly (a channel per address) or through the mesh (one
    channel to Envoy, the replica named in a header for its ORIGINAL_DST cluster).

    Channels are made without gRPC-level retries: the router re-dispatches to another
    replica itself, and a hop must not be retried at two layers.
    """

    def __init__(
        self, *, mesh_addr: str | None = None, mesh_header: str = "", tls: ServerTls | None = None
    ) -> None:
        self._mesh_addr = mesh_addr
        self._mesh_header = mesh_header
        self._tls = tls  # this router's mesh certificate, when ports demand one
        self._channels: dict[str, grpc.aio.Channel] = {}

    def stub(
        self, replica: str
    ) -> tuple[inf_grpc.InferenceServiceAsyncStub, tuple[tuple[str, str], ...]]:
        """The stub to call and the metadata that routes the call to `replica`."""
        channel, metadata = self.channel(replica)
        return inf_grpc.InferenceServiceStub(channel), metadata

    def channel(self, replica: str) -> tuple[grpc.aio.Channel, tuple[tuple[str, str], ...]]:
        """The channel to call on and the metadata that routes the call to `replica`."""
        if self._mesh_addr is not None:
            return self._channel_for(self._mesh_addr), ((self._mesh_header, replica),)
        return self._channel_for(replica), ()

    def _channel_for(self, target: str) -> grpc.aio.Channel:
        channel = self._channels.get(target)
        if channel is None:
            channel = self._channels[target] = make_channel(
                target, retry_unavailable=False, tls=self._tls
            )
        return channel

    async def close(self) -> None:
        channels, self._channels = list(self._channels.values()), {}
        for channel in channels:
            await channel.close()


class InferenceClient:
    """Generate, Embed and WatchLoad on a chosen replica."""

    service = "inference"

    def __init__(self, channels: ReplicaChannels) -> None:
        self._channels = channels

    def generate(
        self, replica: str, request: inf_pb.GenerateRequest, *, stop_timeout_s: float = 1.0
    ) -> GenerateCall:
        """Start a stream; its deadline is the caller's remaining one. Stopping it early waits
        `stop_timeout_s` at most for the replica's count."""
        stub, metadata = self._channels.stub(replica)

        async def stop(timeout_s: float) -> int:
            reply = await stub.Stop(
                inf_pb.StopRequest(request_id=request.request_id),
                metadata=metadata,
                timeout=timeout_s,
            )
            return reply.stopped

        return GenerateCall(
            replica, stub.Generate(request, metadata=metadata), stop, stop_timeout_s
        )

    async def embed(self, replica: str, request: inf_pb.EmbedRequest) -> inf_pb.EmbedResponse:
        stub, metadata = self._channels.stub(replica)
        try:
            # No own timeout: a large batch may take long; the caller's deadline bounds it.
            response: inf_pb.EmbedResponse = await stub.Embed(request, metadata=metadata)
        except grpc.aio.AioRpcError as err:
            raise replica_error(replica, err) from None
        return response

    async def probe(self, replica: str, timeout_s: float) -> inf_pb.InfoResponse | None:
        """Info from `replica` when it serves and is not draining; None when it does not (yet).

        Health is asked where it can be: a mesh that routes only InferenceService answers
        UNIMPLEMENTED, and then the load report's `draining` is the word."""
        channel, metadata = self._channels.channel(replica)
        stub = inf_grpc.InferenceServiceStub(channel)
        try:
            if not await _serving(channel, metadata, timeout_s):
                return None
            load = await stub.GetLoad(inf_pb.GetLoadRequest(), metadata=metadata, timeout=timeout_s)
            if load.load.draining:
                return None
            info: inf_pb.InfoResponse = await stub.Info(
                inf_pb.InfoRequest(), metadata=metadata, timeout=timeout_s
            )
        except grpc.aio.AioRpcError:
            return None
        return info

    async def watch_load(self, replica: str, interval_ms: int) -> AsyncIterator[LoadSnapshot]:
        """Load reports from `replica` until the stream breaks (AioRpcError)."""
        stub, metadata = self._channels.stub(replica)
        call = stub.WatchLoad(inf_pb.WatchLoadRequest(interval_ms=interval_ms), metadata=metadata)
        try:
            async for message in call:
                yield snapshot_from(message.load)
        finally:
            call.cancel()


def snapshot_from(report: inf_pb.LoadReport) -> LoadSnapshot:
    """The domain copy of a LoadReport."""
    return LoadSnapshot(
        num_waiting=report.num_waiting,
        num_running=report.num_running,
        kv_cache_usage=report.kv_cache_usage,
        waiting_prompt_tokens=report.waiting_prompt_tokens,
        running_remaining_tokens=report.running_remaining_tokens,
        tokens_per_second=report.tokens_per_second,
        max_num_seqs=max(1, report.max_num_seqs),
        draining=report.draining,
    )


async def _serving(
    channel: grpc.aio.Channel, metadata: tuple[tuple[str, str], ...], timeout_s: float
) -> bool:
    """Health SERVING; True too when health is not routed to the replica (UNIMPLEMENTED)."""
    health = health_pb2_grpc.HealthStub(channel)
    try:
        reply = await health.Check(
            health_pb2.HealthCheckRequest(service=INFERENCE_SERVICE),
            metadata=metadata,
            timeout=timeout_s,
        )
    except grpc.aio.AioRpcError as err:
        if err.code() == grpc.StatusCode.UNIMPLEMENTED:
            return True
        raise
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
