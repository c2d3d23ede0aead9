"""A choice's answer assembled from its chunks, and the finished responses built from them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from llm_router.generation.choices import merged_usage
from llm_router.generation.relay import Chunk
from llm_router.generation.tool_calls import CallAssembler
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb


@dataclass(slots=True)
class Answer:
    """Everything one choice delivered."""

    text: list[str] = field(default_factory=list)
    logprobs: list[common_pb2.TokenLogprob] = field(default_factory=list)
    finish_reason: common_pb2.FinishReason.ValueType = common_pb2.FINISH_REASON_UNSPECIFIED
    usage: common_pb2.Usage = field(default_factory=common_pb2.Usage)
    calls: CallAssembler = field(default_factory=CallAssembler)

    def add(self, chunk: Chunk) -> None:
        if chunk.text:
            self.text.append(chunk.text)
        self.logprobs.extend(chunk.logprobs)
        self.calls.add(chunk.tool_calls)
        if chunk.finish_reason:
            self.finish_reason = chunk.finish_reason
        if chunk.usage is not None:
            self.usage = chunk.usage

    @property
    def content(self) -> str:
        return "".join(self.text)

    def message(self) -> common_pb2.ChatMessage:
        return common_pb2.ChatMessage(
            role=common_pb2.ROLE_ASSISTANT, content=self.content, tool_calls=self.calls.calls()
        )


def fill_chat(response: pb.ChatResponse, answers: Sequence[Answer]) -> None:
    """Message, finish reason, logprobs and usage of a chat response (choices when n > 1)."""
    first = answers[0]
    response.message.CopyFrom(first.message())
    response.finish_reason = first.finish_reason
    response.logprobs.extend(first.logprobs)
    response.usage.CopyFrom(merged_usage([a.usage for a in answers]))
    if len(answers) > 1:
        for index, answer in enumerate(answers):
            response.choices.add(
                index=index,
                message=answer.message(),
                finish_reason=answer.finish_reason,
                logprobs=answer.logprobs,
            )


def fill_completion(response: pb.CompleteResponse, answers: Sequence[Answer]) -> None:
    """Text, finish reason, logprobs and usage of a completion (choices when n > 1)."""
    first = answers[0]
    response.text = first.content
    response.finish_reason = first.finish_reason
    response.logprobs.extend(first.logprobs)
    response.usage.CopyFrom(merged_usage([a.usage for a in answers]))
    if len(answers) > 1:
        for index, answer in enumerate(answers):
            response.choices.add(
                index=index,
                text=answer.content,
                finish_reason=answer.finish_reason,
                logprobs=answer.logprobs,
            )
