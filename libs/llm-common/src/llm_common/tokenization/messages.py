"""Chat messages from the wire, checked with field paths and converted for chat templates."""

from __future__ import annotations

from collections.abc import Sequence

from llm_common.config import MIB
from llm_common.tokenization.chat_template import ChatMessage, MessageToolCall
from llm_common.tokenization.tool_defs import TOOL_TYPE, ToolDataError
from llm_common.tools.jsontext import JsonTextError, load_object
from llm_common.validation import Violations
from llmapi.common.v1 import common_pb2

ROLE_NAMES = {
    common_pb2.ROLE_SYSTEM: "system",
    common_pb2.ROLE_USER: "user",
    common_pb2.ROLE_ASSISTANT: "assistant",
    common_pb2.ROLE_TOOL: "tool",
}
_ROLE_CHOICES = ", ".join(common_pb2.Role.Name(role) for role in ROLE_NAMES)
# The tokenizer service's default limits (its Limits default to these), for in-process parity.
DEFAULT_MAX_MESSAGES = 1024
DEFAULT_MAX_TEXT_BYTES = MIB


def messages_from_proto(
    messages: Sequence[common_pb2.ChatMessage],
    field: str = "messages",
    *,
    max_messages: int = DEFAULT_MAX_MESSAGES,
    max_text_bytes: int = DEFAULT_MAX_TEXT_BYTES,
) -> list[ChatMessage]:
    """check_messages, raising ToolDataError (a ValueError) with every violation instead."""
    v = Violations()
    converted = check_messages(
        v, field, messages, max_messages=max_messages, max_text_bytes=max_text_bytes
    )
    if v:
        raise ToolDataError(v.items)
    return converted


def check_messages(
    v: Violations,
    field: str,
    messages: Sequence[common_pb2.ChatMessage],
    *,
    max_messages: int,
    max_text_bytes: int,
) -> list[ChatMessage]:
    """1..max_messages with known roles and at most max_text_bytes of text in total (content,
    names, call ids, names and arguments); tool calls only on assistant messages, with
    arguments that are JSON objects; tool_call_id only on tool messages."""
    if not messages:
        v.add(field, "must not be empty")
        return []
    if len(messages) > max_messages:
        v.add(field, f"at most {max_messages} messages")
        return []
    # Strings of a parsed protobuf are valid UTF-8.
    if not v.require(
        sum(map(_size, messages)) <= max_text_bytes,
        field,
        f"content and names must total at most {max_text_bytes} bytes of UTF-8",
    ):
        return []
    return [_message(v, f"{field}[{i}]", m) for i, m in enumerate(messages)]


def _size(message: common_pb2.ChatMessage) -> int:
    texts = [message.content, message.name, message.tool_call_id]
    for call in message.tool_calls:
        texts += (call.id, call.function.name, call.function.arguments)
    return sum(len(text.encode("utf-8")) for text in texts)


def _message(v: Violations, field: str, message: common_pb2.ChatMessage) -> ChatMessage:
    role = ROLE_NAMES.get(message.role)
    if role is None:
        v.add(f"{field}.role", f"must be one of {_ROLE_CHOICES}")
    if message.tool_call_id and role not in (None, "tool"):
        v.add(f"{field}.tool_call_id", "is only for tool messages")
    return ChatMessage(
        role=role or "",
        content=message.content,
        name=message.name,
        tool_calls=_calls(v, field, message, role),
        tool_call_id=message.tool_call_id,
    )


def _calls(
    v: Violations, field: str, message: common_pb2.ChatMessage, role: str | None
) -> tuple[MessageToolCall, ...]:
    if not message.tool_calls:
        return ()
    if role not in (None, "assistant"):
        v.add(f"{field}.tool_calls", "are only for assistant messages")
        return ()
    calls = (_call(v, f"{field}.tool_calls[{i}]", c) for i, c in enumerate(message.tool_calls))
    return tuple(call for call in calls if call is not None)


def _call(v: Violations, field: str, call: common_pb2.ToolCall) -> MessageToolCall | None:
    ok = v.require(call.type in ("", TOOL_TYPE), f"{field}.type", f'must be "{TOOL_TYPE}"')
    ok &= v.require(bool(call.function.name), f"{field}.function.name", "is required")
    try:
        # No arguments at all is an empty object, as some clients send it.
        arguments = load_object(call.function.arguments or "{}")
    except JsonTextError as exc:
        v.add(f"{field}.function.arguments", str(exc))
        return None
    return MessageToolCall(call.id, call.function.name, arguments) if ok else None
