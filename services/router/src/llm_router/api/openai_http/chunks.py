"""LLMService stream messages -> OpenAI's streaming chunks (server-sent events)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from llm_router.api.openai_http.responses import (
    JSON,
    chat_logprobs,
    finish_reason,
    sse,
    text_logprobs,
    usage,
)
from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

StreamMessage = pb.ChatStreamResponse | pb.CompleteStreamResponse


def tool_call_deltas(deltas: Sequence[common_pb2.ToolCallDelta]) -> list[JSON]:
    """As OpenAI sends them: id, type and name on a call's first fragment, then arguments."""
    out: list[JSON] = []
    for d in deltas:
        if d.id or d.name:
            out.append(
                {
                    "index": d.index,
                    "id": d.id,
                    "type": "function",
                    "function": {"name": d.name, "arguments": d.arguments},
                }
            )
        else:
            out.append({"index": d.index, "function": {"arguments": d.arguments}})
    return out


class ChunkMaker:
    """Streaming chunks of one answer, with the id, model and time fixed by its first message.

    Each message belongs to one choice (its index): a chat choice opens with the assistant
    role; legacy text offsets count per choice."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.id = ""
        self.model = ""
        self.created = int(time.time())
        self.usage: JSON | None = None
        self._opened: set[int] = set()  # chat choices whose role chunk went out
        self._offsets: dict[int, int] = {}  # text offset reached per completion choice

    def _base(self) -> JSON:
        prefix, kind = (
            ("chatcmpl", "chat.completion.chunk") if self.chat else ("cmpl", "text_completion")
        )
        return {
            "id": f"{prefix}-{self.id}",
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
        }

    def _chunk(self, choice: JSON) -> bytes:
        return sse(self._base() | {"choices": [choice]})

    def _opening(self, index: int) -> bytes:
        """The assistant role, once per chat choice, as OpenAI's streams open. Choices open in
        index order (clients append a choice they have not seen)."""
        if not self.chat:
            return b""
        out = b""
        for i in range(index + 1):
            if i not in self._opened:
                self._opened.add(i)
                delta = {"role": "assistant", "content": ""}
                out += self._chunk(
                    {"index": i, "delta": delta, "logprobs": None, "finish_reason": None}
                )
        return out

    def first(self, message: StreamMessage) -> bytes:
        self.id, self.model = message.request_id, message.model
        return self._opening(message.index)

    def piece(self, message: StreamMessage) -> bytes:
        """The chunk(s) for one LLMService message (empty when it carries nothing to say)."""
        reason = finish_reason(message.finish_reason)
        if message.HasField("usage"):
            self.usage = usage(message.usage)
        calls = message.tool_calls if isinstance(message, pb.ChatStreamResponse) else ()
        if not message.delta and not calls and reason is None and not message.logprobs:
            return b""
        if isinstance(message, pb.ChatStreamResponse):
            return self._opening(message.index) + self._chunk(self._chat_choice(message, reason))
        return self._chunk(self._text_choice(message, reason))

    def _chat_choice(self, message: pb.ChatStreamResponse, reason: str | None) -> JSON:
        delta: JSON = {}
        if message.delta:
            delta["content"] = message.delta
        if message.tool_calls:
            delta["tool_calls"] = tool_call_deltas(message.tool_calls)
        return {
            "index": message.index,
            "delta": delta,
            "logprobs": chat_logprobs(message.logprobs),
            "finish_reason": reason,
        }

    def _text_choice(self, message: pb.CompleteStreamResponse, reason: str | None) -> JSON:
        start = self._offsets.get(message.index, 0)
        self._offsets[message.index] = start + len(message.delta)
        return {
            "index": message.index,
            "text": message.delta,
            "logprobs": text_logprobs(message.logprobs, start),
            "finish_reason": reason,
        }

    def usage_chunk(self) -> bytes:
        """stream_options.include_usage: a last chunk with no choices and the usage."""
        return sse(self._base() | {"choices": [], "usage": self.usage})
