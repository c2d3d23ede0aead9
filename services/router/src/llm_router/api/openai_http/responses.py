"""LLMService answers -> OpenAI response objects (streaming chunks: chunks.py)."""

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
    common_pb2.FINISH_REASON_TOOL_CALLS: "tool_calls",
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


def token_bytes(lp: common_pb2.TokenLogprob | common_pb2.TopLogprob) -> list[int]:
    """The raw bytes (UTF-8 of the text when a server left them out)."""
    return list(lp.bytes) if lp.bytes else list(lp.token.encode("utf-8"))


def chat_logprobs(logprobs: Sequence[common_pb2.TokenLogprob]) -> JSON | None:
    """{"content": [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}."""
    if not logprobs:
        return None
    content = [
        {
            "token": lp.token,
            "logprob": lp.logprob,
            "bytes": token_bytes(lp),
            "top_logprobs": [
                {"token": top.token, "logprob": top.logprob, "bytes": token_bytes(top)}
                for top in lp.top_logprobs
            ],
        }
        for lp in logprobs
    ]
    return {"content": content, "refusal": None}


def text_logprobs(logprobs: Sequence[common_pb2.TokenLogprob], start: int = 0) -> JSON | None:
    """The legacy shape: parallel lists; `start` is the text offset of the first token."""
    if not logprobs:
        return None
    offsets = []
    for lp in logprobs:
        offsets.append(start)
        start += len(lp.token)
    tops = [{top.token: top.logprob for top in lp.top_logprobs} for lp in logprobs]
    return {
        "tokens": [lp.token for lp in logprobs],
        "token_logprobs": [lp.logprob for lp in logprobs],
        "top_logprobs": tops if any(tops) else None,
        "text_offset": offsets,
    }


def tool_call(call: common_pb2.ToolCall) -> JSON:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.function.name, "arguments": call.function.arguments},
    }


def chat_message(message: common_pb2.ChatMessage) -> JSON:
    """The assistant's message; content is null when it only calls tools, as at OpenAI."""
    calls = [tool_call(c) for c in message.tool_calls]
    content = message.content if message.content or not calls else None
    body: JSON = {"role": "assistant", "content": content, "refusal": None}
    if calls:
        body["tool_calls"] = calls
    return body


def _chat_choices(reply: pb.ChatResponse) -> list[pb.ChatChoice]:
    """Every completion (n > 1), or the one in the top-level fields."""
    if reply.choices:
        return sorted(reply.choices, key=lambda c: c.index)
    only = pb.ChatChoice(index=0, finish_reason=reply.finish_reason, logprobs=reply.logprobs)
    only.message.CopyFrom(reply.message)
    return [only]


def _text_choices(reply: pb.CompleteResponse) -> list[pb.CompletionChoice]:
    if reply.choices:
        return sorted(reply.choices, key=lambda c: c.index)
    return [
        pb.CompletionChoice(
            index=0, text=reply.text, finish_reason=reply.finish_reason, logprobs=reply.logprobs
        )
    ]


def chat_completion(reply: pb.ChatResponse) -> JSON:
    return {
        "id": f"chatcmpl-{reply.request_id}",
        "object": "chat.completion",
        "created": created(reply),
        "model": reply.model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": choice.index,
                "message": chat_message(choice.message),
                "logprobs": chat_logprobs(choice.logprobs),
                "finish_reason": finish_reason(choice.finish_reason),
            }
            for choice in _chat_choices(reply)
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
                "index": choice.index,
                "text": choice.text,
                "logprobs": text_logprobs(choice.logprobs),
                "finish_reason": finish_reason(choice.finish_reason),
            }
            for choice in _text_choices(reply)
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
