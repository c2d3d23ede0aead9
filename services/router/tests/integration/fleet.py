"""A fleet for the resilience scenarios: inference replicas as real processes on 127.0.0.x
sharing one port (pods behind a headless Service), a real DNS server on loopback naming
them, a router that discovers them by DNS, and steady streaming load through it."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from dnslib import QTYPE, RR, A
from dnslib.server import BaseResolver, DNSServer
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llm_common.models_config import Deployment, Discovery
from llm_testing import free_port
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

NAME = "inference.fleet.test."
START_TIMEOUT_S = 120.0


class Records(BaseResolver):  # type: ignore[misc]
    """Answers A queries for NAME with whatever `addresses` holds at the time."""

    def __init__(self) -> None:
        self.addresses: list[str] = []

    def resolve(self, request: Any, handler: Any) -> Any:
        reply = request.reply()
        if str(request.q.qname) == NAME and request.q.qtype == QTYPE.A:
            for address in self.addresses:
                reply.add_answer(RR(NAME, QTYPE.A, rdata=A(address), ttl=1))
        return reply


@contextlib.contextmanager
def dns_server() -> Iterator[tuple[Records, int]]:
    records, port = Records(), free_port()
    server = DNSServer(records, port=port, address="127.0.0.1")
    server.start_thread()
    try:
        yield records, port
    finally:
        server.stop()


@dataclass
class Replica:
    """One `python -m llm_inference` process bound to host:port."""

    host: str
    port: int
    catalog: Path
    grace_s: float = 10.0
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self) -> None:
        env = {
            **os.environ, "METRICS_PORT": "off", "LOG_LEVEL": "WARNING", "INFERENCE_DEVICE": "cpu",
            "MODELS_CONFIG": str(self.catalog), "INFERENCE_MODEL": "demo",
            "GRPC_PORT": str(self.port), "BIND_HOST": self.host, "REPLICA_ID": self.address,
            "INFERENCE_KV_CACHE_BYTES": str(16 << 20), "SHUTDOWN_GRACE_S": str(self.grace_s),
            "OMP_NUM_THREADS": "1",  # several replicas share few cores
        }  # fmt: skip
        self.process = subprocess.Popen(
            [sys.executable, "-m", "llm_inference"], env=env, stdout=subprocess.DEVNULL
        )

    def wait_serving(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        with grpc.insecure_channel(self.address) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while True:
                assert self.process is not None
                assert self.process.poll() is None, f"{self.address} exited"
                try:
                    status = health.Check(health_pb2.HealthCheckRequest(), timeout=2).status
                    if status == health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                assert time.monotonic() < deadline, f"{self.address} not serving"
                time.sleep(0.1)

    def kill(self) -> None:
        """SIGKILL: a node lost."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def terminate(self) -> None:
        """SIGTERM: a graceful drain (see llm_inference.drain)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait_exit(self, timeout_s: float = 60.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout_s)


def dns_deployment(dns_port: int, replica_port: int, interval_s: float = 0.2) -> Deployment:
    found = Discovery(kind="dns", service=NAME, port=replica_port, interval_s=interval_s,
                      nameserver=f"127.0.0.1:{dns_port}")  # fmt: skip
    return Deployment(name="fleet", discovery=found)


@dataclass
class Load:
    """Streaming chats in a loop on `workers` tasks until stopped; each outcome kept."""

    router: Any
    metadata: Any
    max_tokens: int = 16
    workers: int = 3
    outcomes: list[StreamResult] = field(default_factory=list)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def start(self) -> None:
        self._tasks = [asyncio.ensure_future(self._loop(w)) for w in range(self.workers)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def _loop(self, worker: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            text = f"worker {worker} request {n}: tell me about the fleet"
            self.outcomes.append(await stream_chat(self.router, self.metadata, text,
                                                   self.max_tokens))  # fmt: skip

    @property
    def failed(self) -> list[StreamResult]:
        return [o for o in self.outcomes if o.code != "OK" or o.finish != "LENGTH"]

    def tokens_per_second(self, since: float, until: float) -> float:
        done = [o for o in self.outcomes if since <= o.ended < until]
        return sum(o.tokens for o in done) / max(until - since, 1e-9)


@dataclass(frozen=True, slots=True)
class StreamResult:
    code: str
    finish: str
    tokens: int
    token_ids: tuple[int, ...]
    text: str
    usage_completion: int
    started: float
    ended: float
    ttft_s: float
    largest_gap_s: float  # the longest wait between two messages after the first


async def stream_chat(
    router: Any,
    metadata: Any,
    text: str,
    max_tokens: int,
    sampling: common_pb2.SamplingParams | None = None,
    on_message: Callable[[], None] | None = None,
) -> StreamResult:
    sampling = sampling or common_pb2.SamplingParams(
        temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=True
    )
    request = pb.ChatStreamRequest(
        model="demo",
        messages=[common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)],
        sampling=sampling,
        cache=pb.CachePolicy(bypass=True),
    )
    started = time.monotonic()
    stamps: list[float] = []
    messages: list[pb.ChatStreamResponse] = []
    code = "OK"
    try:
        async for message in router.stub.ChatStream(request, metadata=metadata, timeout=120):
            stamps.append(time.monotonic())
            messages.append(message)
            if on_message is not None:
                on_message()
    except grpc.aio.AioRpcError as err:
        code = err.code().name
    ended = time.monotonic()
    last = messages[-1] if messages else None
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    return StreamResult(
        code=code,
        finish=common_pb2.FinishReason.Name(last.finish_reason).removeprefix("FINISH_REASON_")
        if last is not None
        else "",
        tokens=sum(len(m.logprobs) for m in messages),
        token_ids=tuple(lp.token_id for m in messages for lp in m.logprobs),
        text="".join(m.delta for m in messages),
        usage_completion=last.usage.completion_tokens if last is not None else 0,
        started=started,
        ended=ended,
        ttft_s=(stamps[0] - started) if stamps else 0.0,
        largest_gap_s=max(gaps, default=0.0),
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
