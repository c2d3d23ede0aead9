"""What the chaos scenarios share: a chat through the edge, and a metric read off a process."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass

import grpc
from prometheus_client.parser import text_string_to_metric_families

from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb
from llmapi.llm.v1 import llm_service_pb2_grpc as pb_grpc


@dataclass(frozen=True, slots=True)
class Outcome:
    """The final status of one chat and, when OK, the usage its reply reported."""

    code: str
    prompt_tokens: int = 0
    completion_tokens: int = 0


def bearer(key: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {key}"),)


def chat(channel: grpc.Channel, key: str, text: str, max_tokens: int = 8) -> Outcome:
    """One unary chat through the edge."""
    message = common_pb2.ChatMessage(role=common_pb2.ROLE_USER, content=text)
    sampling = common_pb2.SamplingParams(max_tokens=max_tokens, temperature=0)
    request = pb.ChatRequest(model="demo", messages=[message], sampling=sampling)
    try:
        reply = pb_grpc.LLMServiceStub(channel).Chat(request, metadata=bearer(key), timeout=60)
    except grpc.RpcError as error:
        return Outcome(str(error.code().name))
    assert reply.usage.completion_tokens > 0
    return Outcome("OK", reply.usage.prompt_tokens, reply.usage.completion_tokens)


def metric_sum(address: str, sample_name: str, **labels: str) -> float:
    """The sum of `sample_name` samples whose labels include `labels`; 0 when unreachable."""
    try:
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=2) as response:
            text = response.read().decode()
    except OSError:
        return 0.0
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == sample_name and all(sample.labels.get(k) == v for k, v in labels.items())
    )
