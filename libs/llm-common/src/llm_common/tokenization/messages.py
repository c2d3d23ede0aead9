"""Chat messages from the wire, checked with field paths and converted for chat templates."""

from __future__ import annotations

from collections.abc import Sequence

from llm_common.config import MIB
from llm_common.tokenization.chat_template import ChatMessage
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


def check_messages(
    v: Violations,
    field: str,
    messages: Sequence[common_pb2.ChatMessage],
    *,
    max_messages: int,
    max_text_bytes: int,
) -> list[ChatMessage]:
    """1..max_messages with known roles and at most max_text_bytes of content in total."""
    if not messages:
        v.add(field, "must not be empty")
        return []
    if len(messages) > max_messages:
        v.add(field, f"at most {max_messages} messages")
        return []
    converted = [_message(v, f"{field}[{i}]", m) for i, m in enumerate(messages)]
    size = sum(len(m.content.encode("utf-8")) + len(m.name.encode("utf-8")) for m in converted)
    v.require(
        size <= max_text_bytes,
        field,
        f"content and names must total at most {max_text_bytes} bytes of UTF-8",
    )
    return converted


def _message(v: Violations, field: str, message: common_pb2.ChatMessage) -> ChatMessage:
    role = ROLE_NAMES.get(message.role)
    if role is None:
        v.add(f"{field}.role", f"must be one of {_ROLE_CHOICES}")
    return ChatMessage(role=role or "", content=message.content, name=message.name)
