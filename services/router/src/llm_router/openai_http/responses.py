"""LLMService answers -> OpenAI response objects and server-sent-event chunks."""

from __future__ import annotations

import base64
import json
import struct
import time
from collections.abc import Sequence
from typing import Any

from llmapi.common.v1 import common_pb2
from llmapi.llm.v1 import llm_service_pb2 as pb

_FINISH: dict[int, str] = {
    common_pb2.FINISH_REASON_STOP: "stop",
    common_pb2.FINISH_REASON_LENGTH: "length",
    common_pb2.FINISH_REASON_CONTENT_FILTER: "content_filter",
    common_pb2.FINISH_REASON_CANCELLED: "stop",
}
DONE = b"data: [DONE]\n\n"
OWNER = "llm-platform"

JSON = dict[str, Any]


def finish_reason(value: int) -> str | None:
    return _FINISH.get(value)


def usage(u: common_pb2.Usage) -> JSON:
    return {
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.total_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    }


def created(message: Any) -> int:
    """Unix seconds of the answer (its `created` timestamp, or now)."""
    stamp = getattr(message, "created", None)
    if stamp is not None and stamp.seconds:
        return int(stamp.seconds)
    return int(time.time())


def _chat_logprobs(logprobs: Sequence[common_pb2.TokenLogprob]) -> JSON | None:
    if not logprobs:
        return None
    content = [
        {
            "token": lp.token,
            "logprob": lp.logprob,
            "bytes": list(lp.token.encode("utf-8")),
            "top_logprobs": [],
        }
        for lp in logprobs
    ]
    return {"content": content}


def _text_logprobs(logprobs: Sequence[common_pb2.TokenLogprob]) -> JSON | None:
    if not logprobs:
        return None
    return {
        "tokens": [lp.token for lp in logprobs],
        "token_logprobs": [lp.logprob for lp in logprobs],
        "top_logprobs": None,
        "text_offset": None,
    }


def chat_completion(reply: pb.ChatResponse) -> JSON:
    return {
        "id": f"chatcmpl-{reply.request_id}",
        "object": "chat.completion",
        "created": created(reply),
        "model": reply.model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply.message.content, "refusal": None},
                "logprobs": _chat_logprobs(reply.logprobs),
                "finish_reason": finish_reason(reply.finish_reason),
            }
        ],
        "usage": usage(reply.usage),
    }


def text_completion(reply: pb.CompleteResponse) -> JSON:
    return {
        "id": f"cmpl-{reply.request_id}",
        "object": "text_completion",
        "created": created(reply),
        "model": reply.model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "text": reply.text,
                "logprobs": _text_logprobs(reply.logprobs),
                "finish_reason": finish_reason(reply.finish_reason),
            }
        ],
        "usage": usage(reply.usage),
    }


def sse(payload: JSON) -> bytes:
    """One server-sent event."""
    return (
        b"data: "
        + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
        + b"\n\n"
    )


class ChunkMaker:
    """Streaming chunks of one answer, with the id, model and time fixed by its first message."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.id = ""
        self.model = ""
        self.created = int(time.time())
        self.usage: JSON | None = None

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

    def first(self, message: pb.ChatStreamResponse | pb.CompleteStreamResponse) -> bytes:
        """Chat streams open with the assistant role, as OpenAI's do."""
        self.id, self.model = message.request_id, message.model
        if not self.chat:
            return b""
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return sse(self._base() | {"choices": [choice]})

    def piece(self, message: pb.ChatStreamResponse | pb.CompleteStreamResponse) -> bytes:
        """The chunk for one LLMService message (empty when it carries nothing to say)."""
        reason = finish_reason(message.finish_reason)
        if message.HasField("usage"):
            self.usage = usage(message.usage)
        if not message.delta and reason is None and not message.logprobs:
            return b""
        if self.chat:
            choice: JSON = {
                "index": 0,
                "delta": {"content": message.delta} if message.delta else {},
                "logprobs": _chat_logprobs(message.logprobs),
                "finish_reason": reason,
            }
        else:
            choice = {
                "index": 0,
                "text": message.delta,
                "logprobs": _text_logprobs(message.logprobs),
                "finish_reason": reason,
            }
        return sse(self._base() | {"choices": [choice]})

    def usage_chunk(self) -> bytes:
        """stream_options.include_usage: a last chunk with no choices and the usage."""
        return sse(self._base() | {"choices": [], "usage": self.usage})


def embeddings(reply: pb.EmbedResponse, as_base64: bool) -> JSON:
    data = []
    for item in sorted(reply.embeddings, key=lambda e: e.index):
        vector: Any = list(item.values)
        if as_base64:
            vector = base64.b64encode(struct.pack(f"<{len(item.values)}f", *item.values)).decode()
        data.append({"object": "embedding", "index": item.index, "embedding": vector})
    return {
        "object": "list",
        "data": data,
        "model": reply.model,
        "usage": {
            "prompt_tokens": reply.usage.prompt_tokens,
            "total_tokens": reply.usage.total_tokens,
        },
    }


def model_entry(name: str) -> JSON:
    return {"id": name, "object": "model", "created": 0, "owned_by": OWNER}


def model_list(reply: pb.ListModelsResponse) -> JSON:
    """Canonical names and their aliases, each usable as `model`."""
    names: list[str] = []
    for model in reply.models:
        names.extend(n for n in (model.name, *model.aliases) if n not in names)
    return {"object": "list", "data": [model_entry(n) for n in names]}
