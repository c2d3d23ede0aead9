"""Request checks: every violation is collected with its field path before any work starts."""

from __future__ import annotations

from collections.abc import Sequence

from llm_common.tokenization import messages, tool_defs
from llm_common.tokenization.chat_template import ChatMessage, ToolDefinition
from llm_common.validation import Violations
from llm_tokenizer.config import Limits
from llmapi.common.v1 import common_pb2


def start(model: str) -> Violations:
    """A collector that already holds the model-name check every RPC shares."""
    v = Violations()
    v.require(bool(model), "model", "is required")
    return v


def utf8_exceeds(text: str, max_bytes: int) -> bool:
    """Whether `text` is longer than `max_bytes` in UTF-8.

    chars <= bytes <= 4 * chars, so most texts are decided without encoding them. Strings from
    a parsed protobuf are always valid UTF-8.
    """
    chars = len(text)
    if chars * 4 <= max_bytes:
        return False
    if chars > max_bytes:
        return True
    return len(text.encode("utf-8")) > max_bytes


def check_batch(v: Violations, field: str, count: int, limits: Limits) -> bool:
    if count == 0:
        v.add(field, "must not be empty")
        return False
    return v.require(count <= limits.max_batch, field, f"at most {limits.max_batch} items")


def check_texts(v: Violations, field: str, texts: Sequence[str], limits: Limits) -> None:
    """1..max_batch texts, each at most max_text_bytes (an empty text is fine)."""
    if not check_batch(v, field, len(texts), limits):
        return
    max_bytes = limits.max_text_bytes
    for i, text in enumerate(texts):
        if utf8_exceeds(text, max_bytes):
            v.add(f"{field}[{i}]", f"must be at most {max_bytes} bytes of UTF-8")


def check_sequence_sizes(
    v: Violations, field: str, sequences: Sequence[Sequence[int]], limits: Limits
) -> None:
    """1..max_batch sequences of at most max_ids_per_sequence ids each."""
    if not check_batch(v, field, len(sequences), limits):
        return
    max_ids = limits.max_ids_per_sequence
    for i, ids in enumerate(sequences):
        v.require(len(ids) <= max_ids, f"{field}[{i}].ids", f"at most {max_ids} ids")


def check_ids(
    v: Violations, field: str, sequences: Sequence[Sequence[int]], vocab_size: int
) -> None:
    """Every id in [0, vocab_size); reports the first bad id of each sequence."""
    for i, ids in enumerate(sequences):
        # min/max run in C; the index is searched only for a sequence known to be bad.
        if ids and (min(ids) < 0 or max(ids) >= vocab_size):
            j = next(j for j, token in enumerate(ids) if not 0 <= token < vocab_size)
            v.add(f"{field}[{i}].ids[{j}]", f"{ids[j]} is outside the vocabulary [0, {vocab_size})")


def check_messages(
    v: Violations, field: str, chat: Sequence[common_pb2.ChatMessage], limits: Limits
) -> list[ChatMessage]:
    """llm_common.tokenization.messages.check_messages under this service's limits."""
    return messages.check_messages(
        v, field, chat, max_messages=limits.max_messages, max_text_bytes=limits.max_text_bytes
    )


def check_tools(
    v: Violations, field: str, tools: Sequence[common_pb2.Tool], limits: Limits
) -> list[ToolDefinition]:
    """llm_common.tokenization.tool_defs.check_tools: at most MAX_TOOLS tools whose
    descriptions and schemas total at most max_text_bytes (a budget apart from the chat's)."""
    return tool_defs.check_tools(v, field, tools, max_bytes=limits.max_text_bytes)


def check_one_of(v: Violations, texts: int, messages: int) -> bool:
    """CountTokens takes texts or messages, never both or neither."""
    if texts and messages:
        v.add("messages", "must be empty when texts are set (set exactly one)")
        return False
    return v.require(bool(texts or messages), "texts", "set exactly one of texts or messages")


def check_tools_with_messages(v: Violations, tools: int, messages: int) -> bool:
    """Tools are rendered into a conversation; counting texts has no use for them."""
    return v.require(not tools or bool(messages), "tools", "must be empty when texts are set")
