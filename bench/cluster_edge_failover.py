"""Failover through the edge (used by `make bench-cluster` and tests/cluster): the whole
local platform on a Redis Cluster, chats streamed through Envoy by several clients while a
master is SIGKILLed; the operator replaces the dead node by an empty replica a second later.

A client retries a chat that failed (as OpenAI SDKs do); a chat counts once, when answered.
Checks: the time from the kill until every chat succeeds again; billing's ledger for the
tenant equals the tokens the clients were told about (Reserve/Settle wait for a replica, so
nothing acknowledged dies with the master).
"""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import timestamp_pb2

from llm_stack import catalogue
from llm_stack.config import StackConfig, free_ports
from llm_stack.demo import create_key
from llm_stack.stack import Endpoints, Stack
from llm_testing.redis_cluster_local import LocalCluster
from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.billing.v1 import billing_service_pb2_grpc as billing_grpc
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc

CLIENTS = 6
RETRY_PAUSE_S = 0.1
CALL_TIMEOUT_S = 30.0


@dataclass
class EdgeFailoverResult:
    """What the scenario measured (bench/results/cluster.json, "edge_failover")."""

    killed_port: int
    chats_answered: int
    failed_attempts: int
    recovery_s: float  # kill -> last failed attempt (0: none failed)
    billed_requests: int
    billed_tokens: int
    client_tokens: int
    duration_s: float
    errors: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Tally:
    lock: threading.Lock = field(default_factory=threading.Lock)
    answered: int = 0
    tokens: int = 0
    failed_at: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)

    def failed(self, code: str) -> None:
        with self.lock:
            self.failed_at.append(time.monotonic())
            self.errors[code] = self.errors.get(code, 0) + 1

    def done(self, tokens: int) -> None:
        with self.lock:
            self.answered += 1
            self.tokens += tokens


def start_stack(root: Path, cluster: LocalCluster, run_dir: Path) -> Stack:
    """The local platform on `cluster` (ports chosen free), not yet started."""
    config = StackConfig.from_env(root, {"LLM_RUN_DIR": str(run_dir)})
    replicas = catalogue.local_replicas(config.models_config)
    config = replace(
        config.with_ports(free_ports(tuple(r.port for r in replicas))),
        redis_url=cluster.url,
        redis_prefix=f"efo{uuid.uuid4().hex[:8]}:",
    )
    return Stack(config)


def run_edge_failover(
    stack: Stack,
    endpoints: Endpoints,
    cluster: LocalCluster,
    *,
    duration_s: float = 16.0,
    kill_at_s: float = 3.0,
    replace_after_s: float = 1.0,
) -> EdgeFailoverResult:
    """Run the scenario on a started `stack` whose Redis is `cluster` (it loses a master)."""
    assert stack.credentials is not None
    tenant = f"efo-{uuid.uuid4().hex[:8]}"
    key = create_key(endpoints.edge_http, stack.credentials.admin_key, tenant=tenant,
                     name="edge failover", requests_per_minute=0)  # fmt: skip
    tally = _Tally()
    start = time.monotonic()
    stop_at = start + duration_s
    threads = [
        threading.Thread(target=_client, args=(endpoints.edge_http, key, i, stop_at, tally))
        for i in range(CLIENTS)
    ]
    for thread in threads:
        thread.start()
    time.sleep(kill_at_s)
    killed_at = time.monotonic()
    victim = cluster.kill_master()
    time.sleep(replace_after_s)
    cluster.replace(victim)
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - start
    usage = _billed(endpoints.edge_http, stack.credentials.admin_key, tenant, tally.answered)
    after = [t - killed_at for t in tally.failed_at if t >= killed_at]
    return EdgeFailoverResult(
        killed_port=victim,
        chats_answered=tally.answered,
        failed_attempts=len(tally.failed_at),
        recovery_s=round(max(after, default=0.0), 3),
        billed_requests=usage.requests,
        billed_tokens=usage.prompt_tokens + usage.completion_tokens,
        client_tokens=tally.tokens,
        duration_s=round(elapsed, 3),
        errors=dict(tally.errors),
    )


def _client(edge: str, key: str, worker: int, stop_at: float, tally: _Tally) -> None:
    with grpc.insecure_channel(edge) as channel:
        llm = pb_grpc.LLMServiceStub(channel)
        count = 0
        while time.monotonic() < stop_at:
            # A prompt of its own: no cache hit, each chat is generated and billed.
            text = f"failover chat {worker}-{count} {uuid.uuid4().hex[:6]}"
            while True:  # the same chat until it is answered (a client's retry)
                try:
                    tally.done(_chat(llm, key, text))
                    break
                except grpc.RpcError as error:
                    tally.failed(error.code().name)
                    time.sleep(RETRY_PAUSE_S)
            count += 1


def _chat(llm: pb_grpc.LLMServiceStub, key: str, text: str) -> int:
    request = pb.ChatStreamRequest(
        model="demo",
        messages=[common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)],
        sampling=common_pb2.SamplingParams(max_tokens=4, temperature=0),
    )
    replies = list(
        llm.ChatStream(request, metadata=(("authorization", f"Bearer {key}"),),
                       timeout=CALL_TIMEOUT_S)
    )  # fmt: skip
    usage = replies[-1].usage
    return int(usage.prompt_tokens + usage.completion_tokens)


def _billed(edge: str, admin_key: str, tenant: str, answered: int) -> billing_pb.UsageBucket:
    """The tenant's usage once billing has settled every answered chat (or after 60 s)."""
    now = int(time.time())
    request = billing_pb.GetUsageRequest(
        tenant_id=tenant,
        start_time=timestamp_pb2.Timestamp(seconds=now - 3600),
        end_time=timestamp_pb2.Timestamp(seconds=now + 3600),
        granularity=billing_pb.GRANULARITY_TOTAL,
    )
    deadline = time.monotonic() + 60  # settles run after the answer; the outbox replays
    with grpc.insecure_channel(edge) as channel:
        stub = billing_grpc.BillingServiceStub(channel)
        while True:
            total = stub.GetUsage(
                request, metadata=(("authorization", f"Bearer {admin_key}"),), timeout=10
            ).total
            if total.requests >= answered or time.monotonic() > deadline:
                return total
            time.sleep(0.5)
