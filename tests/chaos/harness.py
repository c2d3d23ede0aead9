"""What the chaos scenarios share: chats through the edge (unary and streamed), the billing
ledger, metrics off a process and Envoy's stats, polling with deadlines, and the figures file."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import timestamp_pb2
from prometheus_client.parser import text_string_to_metric_families

from llmapi.billing.v1 import billing_service_pb2 as billing_pb
from llmapi.billing.v1 import billing_service_pb2_grpc as billing_grpc
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results" / "resilience.json"
POLL_S = 0.2


@dataclass(frozen=True, slots=True)
class Outcome:
    """The final status of one chat and, when OK, the usage its reply reported."""

    code: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class StreamOutcome:
    """One streamed chat: its status, finish reason, the tokens the client saw (one logprob
    per token) and the usage the last message reported (zeros when none came)."""

    code: str
    finish: str
    received_tokens: int
    prompt_tokens: int
    completion_tokens: int
    detail: str = ""  # the error message when the status is not OK (who refused, and why)

    @property
    def interrupted(self) -> bool:
        """Output had reached the client when the stream failed."""
        return self.received_tokens > 0 and (self.code != "OK" or self.finish == "ERROR")


def bearer(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


def _messages(text: str) -> list[common_pb2.ChatMessage]:
    return [common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)]


def chat(
    channel: grpc.Channel, key: str, text: str, max_tokens: int = 8, timeout_s: float = 60
) -> Outcome:
    """One unary chat through the edge."""
    sampling = common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0)
    request = pb.ChatRequest(model="demo", messages=_messages(text), sampling=sampling)
    started = time.monotonic()
    try:
        reply = pb_grpc.LLMServiceStub(channel).Chat(
            request, metadata=bearer(key), timeout=timeout_s
        )
    except grpc.RpcError as error:
        return Outcome(str(error.code().name), seconds=time.monotonic() - started)
    assert reply.usage.completion_tokens > 0
    usage = reply.usage
    return Outcome("OK", usage.prompt_tokens, usage.completion_tokens, time.monotonic() - started)


def chat_stream(channel: grpc.Channel, key: str, text: str, max_tokens: int) -> StreamOutcome:
    """One streamed chat that runs to max_tokens (ignore_eos), counting tokens as they come."""
    sampling = common_pb2.SamplingParams(
        max_tokens=max_tokens, temperature=0, ignore_eos=True, logprobs=True
    )
    request = pb.ChatStreamRequest(model="demo", messages=_messages(text), sampling=sampling)
    received, finish = 0, "UNSPECIFIED"
    usage = common_pb2.Usage()
    try:
        for message in pb_grpc.LLMServiceStub(channel).ChatStream(
            request, metadata=bearer(key), timeout=120
        ):
            received += len(message.logprobs)
            if message.finish_reason:
                finish = common_pb2.FinishReason.Name(message.finish_reason)
                finish = finish.removeprefix("FINISH_REASON_")
                usage = message.usage
        code, detail = "OK", ""
    except grpc.RpcError as error:
        code, detail = str(error.code().name), str(error.details() or "")
    usage_counts = (usage.prompt_tokens, usage.completion_tokens)
    return StreamOutcome(code, finish, received, *usage_counts, detail=detail[:200])


def ledger(edge: str, admin_key: str, tenant: str) -> tuple[int, int, int] | None:
    """(requests, prompt tokens, completion tokens) billed to `tenant` in the last hours,
    read through the edge with billing GetUsage; None while billing does not answer."""
    # Billing counts per hour and sums the buckets that START inside the window, so the
    # window begins on an hour boundary: `now - 3600` would drop the current hour's bucket
    # as soon as the clock crosses into the next hour.
    hour = int(time.time()) // 3600 * 3600
    request = billing_pb.GetUsageRequest(
        tenant_id=tenant,
        start_time=timestamp_pb2.Timestamp(seconds=hour - 2 * 3600),
        end_time=timestamp_pb2.Timestamp(seconds=hour + 2 * 3600),
        granularity=billing_pb.GRANULARITY_TOTAL,
    )
    with grpc.insecure_channel(edge) as channel:
        try:
            reply = billing_grpc.BillingServiceStub(channel).GetUsage(
                request, metadata=bearer(admin_key), timeout=10
            )
        except grpc.RpcError as error:
            if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                return None
            raise
    total = reply.total
    return int(total.requests), int(total.prompt_tokens), int(total.completion_tokens)


def _fetch(url: str) -> str | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            text: str = response.read().decode()
            return text
    except OSError:
        return None


def metric_sum(address: str, sample_name: str, **labels: str) -> float:
    """The sum of `sample_name` samples whose labels include `labels`; 0 when unreachable."""
    text = _fetch(f"http://{address}/metrics")
    if text is None:
        return 0.0
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == sample_name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


def envoy_stats(admin: str, prefix: str) -> dict[str, int]:
    """Envoy's counters and gauges whose names start with `prefix` (histograms left out)."""
    text = _fetch(f"http://{admin}/stats?filter=^{prefix}")
    if text is None:
        raise AssertionError(f"envoy admin {admin} does not answer")
    stats: dict[str, int] = {}
    for line in text.splitlines():
        name, sep, value = line.partition(": ")
        if sep and name.startswith(prefix) and value.strip().lstrip("-").isdigit():
            stats[name] = int(value)
    return stats


def ejections(admin: str, cluster: str) -> int:
    """Hosts of `cluster` Envoy's outlier detection has ejected so far."""
    name = f"cluster.{cluster}.outlier_detection.ejections_enforced_total"
    return envoy_stats(admin, name).get(name, 0)


def until(what: str, check: Callable[[], bool], timeout_s: float) -> float:
    """Poll `check` until true; the seconds it took, AssertionError after `timeout_s`."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout_s:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s")
        time.sleep(POLL_S)  # other processes' state: there is no event to wait on
    return time.monotonic() - started


def until_equal(what: str, read: Callable[[], object], expected: object, timeout_s: float) -> float:
    """Poll `read()` until it equals `expected`; the seconds it took. On timeout the
    AssertionError shows the last value read."""
    seen: list[object] = [None]

    def check() -> bool:
        seen[0] = read()
        return seen[0] == expected

    try:
        return until(what, check, timeout_s)
    except AssertionError:
        raise AssertionError(f"{what}: {seen[0]} != {expected} after {timeout_s:.0f} s") from None


def record(scenario: str, figures: dict[str, Any]) -> None:
    """Merge one scenario's figures into resilience.json under "scenarios", keeping what
    other writers (the load and soak benchmarks) put in the same file."""
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    figures = figures | {
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    with _locked(RESULTS.with_suffix(".lock")):
        try:
            data = json.loads(RESULTS.read_text())
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict):
            data = {}
        data.setdefault("scenarios", {})[scenario] = figures
        temporary = RESULTS.with_suffix(".json.tmp")
        temporary.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
        temporary.replace(RESULTS)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """The lock file the load benchmark's writer takes too (bench/results/*.lock is ignored);
    the results file itself is replaced, so it cannot carry the lock."""
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield  # closing the handle releases the lock
