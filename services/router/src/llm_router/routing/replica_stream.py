"""One Generate stream on one replica: its reads, and the two ways to end it early.

Stopping (the replica's Stop RPC, then reading on to the stream's last message) learns how
many tokens the replica generated, the ones it still held for a fuller message included:
what a cancelled request is billed. Cancelling frees the replica at once but learns nothing;
it is the fallback when Stop fails or takes too long.

Reads are shielded from the reader's cancellation. grpc.aio cancels an RPC whose pending
read is cancelled, and a client that goes away cancels the router's handler while it waits
on the replica, so an unshielded read would cancel the stream before it could be stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import grpc

from llm_common.deadlines import deadline_var
from llm_common.errors import DeadlineExceeded, ServiceError
from llm_router.errors import ReplicaFailed, from_rpc_error, is_client_error
from llmapi.inference.v1 import inference_service_pb2 as inf_pb

# A stream that fails this close to its deadline (grpc-timeout is sent rounded) was cut for
# time.
DEADLINE_SLACK_S = 0.01
Stopper = Callable[[float], Awaitable[int]]


class GenerateCall:
    """One Generate stream on one replica; failures become ReplicaFailed or client errors.

    `stopper(timeout_s)` calls the replica's Stop for this stream's request id; `stop()` waits
    `stop_timeout_s` at most for the stream's end.
    """

    def __init__(
        self,
        replica: str,
        call: grpc.aio.UnaryStreamCall[inf_pb.GenerateRequest, inf_pb.GenerateResponse],
        stopper: Stopper | None = None,
        stop_timeout_s: float = 1.0,
    ) -> None:
        self.replica = replica
        self._call = call
        self._stopper = stopper
        self._stop_timeout_s = stop_timeout_s
        self._deadline = deadline_var.get()  # the one the call went out with
        self._pending: asyncio.Task[inf_pb.GenerateResponse | None] | None = None

    async def next(self) -> inf_pb.GenerateResponse | None:
        """The next message, or None when the stream ended normally."""
        read = self._pending
        if read is None:
            read = self._pending = asyncio.ensure_future(self._read())
        message = await asyncio.shield(read)  # cancelled: the read goes on, for stop()
        self._pending = None
        return message

    async def _read(self) -> inf_pb.GenerateResponse | None:
        try:
            message = await self._call.read()
        except grpc.aio.AioRpcError as err:
            if self._expired():
                # Cut for time, whatever the status says: a proxy on the way may reset a
                # stream whose deadline passed (Envoy with a stream timer), read as INTERNAL.
                # Counted as a replica failure, short deadlines would exclude every replica.
                raise DeadlineExceeded("inference did not answer within the deadline") from None
            raise replica_error(self.replica, err) from None
        if message is grpc.aio.EOF:
            return None
        return message  # type: ignore[return-value]

    def _expired(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline - DEADLINE_SLACK_S

    def cancel(self) -> None:
        """Cancel the stream: the replica frees the request's KV blocks at once."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()
            pending.add_done_callback(_retrieve)
        self._call.cancel()

    async def stop(self) -> int | None:
        """End the stream early and return the replica's count of generated tokens, which
        covers every message read before; None when it could not be learned in time (the
        stream is then cancelled). Never raises but for cancellation."""
        total: int | None = None
        timeout_s = self._stop_timeout_s
        try:
            async with asyncio.timeout(timeout_s):
                if self._stopper is None:
                    return None
                await self._stopper(timeout_s)
                while (message := await self.next()) is not None:
                    if message.finish_reason:
                        total = message.usage.completion_tokens
        except (TimeoutError, ReplicaFailed, ServiceError, grpc.aio.AioRpcError):
            pass
        finally:
            if total is None:
                self.cancel()
        return total


def replica_error(replica: str, err: grpc.aio.AioRpcError) -> Exception:
    """ReplicaFailed for faults another replica may not have; the domain error otherwise."""
    code = err.code()
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return ReplicaFailed(replica, code, exclude=False)  # busy, not broken
    if is_client_error(err) or code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return from_rpc_error(err, "inference")
    return ReplicaFailed(replica, code)


def _retrieve(task: asyncio.Task[inf_pb.GenerateResponse | None]) -> None:
    # A cancelled read may still have failed first; read its outcome so none is reported lost.
    if not task.cancelled():
        with contextlib.suppress(Exception):
            task.exception()
