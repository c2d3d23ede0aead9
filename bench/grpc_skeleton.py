"""The router's gRPC call pattern with no logic at all: what grpc-python alone costs.

A "leaf" process answers every call at once (unary echo; a stream of five messages). A
"middle" process serves one unary call by making the router's downstream calls to the leaf:
one call (tokenize), then three unary calls and a five-message stream concurrently (quota,
budget, cache lookup, generation), then two unary calls in the background (settle, store).
The latency this adds over calling the leaf's stream directly is the floor under the router's
added latency on the same machine.

Usage (internal, started by bench_router): python bench/grpc_skeleton.py leaf|middle PORT [LEAF]
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc

from llm_common.grpc_runtime import with_grpc_runtime

STREAM_MESSAGES = 5
PAYLOAD = b"x" * 200


async def _leaf(port: int) -> None:
    async def unary(request: bytes, _: Any) -> bytes:
        return request

    async def stream(request: bytes, _: Any) -> AsyncIterator[bytes]:
        for _ in range(STREAM_MESSAGES):
            yield request

    handlers: dict[str, grpc.RpcMethodHandler[bytes, bytes]] = {
        "U": grpc.unary_unary_rpc_method_handler(unary),
        "S": grpc.unary_stream_rpc_method_handler(stream),
    }
    await _serve(port, grpc.method_handlers_generic_handler("skeleton.Leaf", handlers))


async def _middle(port: int, leaf: int) -> None:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{leaf}")
    unary: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/skeleton.Leaf/U")
    stream: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = channel.unary_stream(
        "/skeleton.Leaf/S"
    )
    background: set[asyncio.Task[Any]] = set()

    async def drain(request: bytes) -> list[bytes]:
        return [message async for message in stream(request)]

    async def handle(request: bytes, _: Any) -> bytes:
        await unary(request)
        await asyncio.gather(unary(request), unary(request), unary(request), drain(request))
        for _ in range(2):
            task = asyncio.ensure_future(unary(request))
            background.add(task)
            task.add_done_callback(background.discard)
        return request

    handler: grpc.RpcMethodHandler[bytes, bytes] = grpc.unary_unary_rpc_method_handler(handle)
    await _serve(port, grpc.method_handlers_generic_handler("skeleton.Middle", {"C": handler}))


async def _serve(port: int, handler: grpc.GenericRpcHandler) -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


def spawn(role: str, *ports: int) -> subprocess.Popen[bytes]:
    """Start a leaf or middle process and wait until it serves."""
    args = [sys.executable, str(Path(__file__).resolve()), role, *map(str, ports)]
    env = with_grpc_runtime(os.environ)  # as the services run
    process = subprocess.Popen(args, stdout=subprocess.PIPE, env=env)
    assert process.stdout is not None
    if process.stdout.readline().strip() != b"ready":
        raise RuntimeError(f"skeleton {role} did not start")
    return process


async def measure(leaf: int, middle: int, requests: int) -> dict[str, float]:
    """Interleaved: the middle's call vs the leaf's stream alone; p50s in ms."""
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{leaf}") as to_leaf,
        grpc.aio.insecure_channel(f"127.0.0.1:{middle}") as to_middle,
    ):
        direct: grpc.aio.UnaryStreamMultiCallable[bytes, bytes] = to_leaf.unary_stream(
            "/skeleton.Leaf/S"
        )
        through: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = to_middle.unary_unary(
            "/skeleton.Middle/C"
        )

        async def leaf_stream() -> None:
            async for _ in direct(PAYLOAD):
                pass

        async def middle_call() -> None:
            await through(PAYLOAD)

        for _ in range(50):  # warm both connections
            await leaf_stream()
            await middle_call()
        times: dict[str, list[float]] = {"direct": [], "skeleton": []}
        for _ in range(requests):
            for name, call in (("direct", leaf_stream), ("skeleton", middle_call)):
                start = time.perf_counter()
                await call()
                times[name].append(time.perf_counter() - start)
    direct_p50 = statistics.median(times["direct"]) * 1e3
    skeleton_p50 = statistics.median(times["skeleton"]) * 1e3
    return {
        "direct_p50_ms": round(direct_p50, 3),
        "skeleton_p50_ms": round(skeleton_p50, 3),
        "added_p50_ms": round(skeleton_p50 - direct_p50, 3),
    }


if __name__ == "__main__":
    role, port = sys.argv[1], int(sys.argv[2])
    if role == "leaf":
        asyncio.run(_leaf(port))
    else:
        asyncio.run(_middle(port, int(sys.argv[3])))
